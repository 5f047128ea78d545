"""The dashboard's pages and actions, as a Starlette application.

Every page reads through the store's public API (``stats``, ``list``, ``get``,
``workers``, ``streams``, ``throughput``, ...); nothing here writes SQL. Pages
are rendered on the server; htmx re-fetches the live part of each page every
few seconds and swaps it in, and posts the actions (cancel, retry, subscribe,
unsubscribe, a group's seek of :mod:`conveyor.web.seek`, and on the tasks list
the bulk actions of :mod:`conveyor.web.bulk`), which exist only when the
dashboard was made with ``allow_actions=True``.

Actions must come from the dashboard's own page: they need the ``HX-Request``
header, which a cross-site form cannot send, so another site cannot make a
logged-in browser press the buttons.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from conveyor import metrics
from conveyor.connect import display_url
from conveyor.encryption import ENCRYPTED
from conveyor.errors import ConveyorError, InvalidArgument
from conveyor.models import Status
from conveyor.store.base import TaskStore
from conveyor.web import bulk, seek
from conveyor.web.graph import dag_svg
from conveyor.web.plot import throughput_svg

HERE = Path(__file__).parent
STATUSES = [s.value for s in Status]
PAGE_SIZE = 50
MAX_TRAIL = 50  # previous-page cursors carried in the address
RETRYABLE = {Status.FAILED, Status.CANCELLED, Status.EVICTED, Status.SKIPPED}

Handler = Callable[[Request], Awaitable[Response]]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _when(value: datetime | None) -> str:
    if value is None:
        return "–"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _since(value: datetime | None) -> str:
    if value is None:
        return "–"
    delta = (datetime.now(UTC) - value).total_seconds()
    return f"{_age(delta)} ago" if delta >= 0 else f"in {_age(-delta)}"


def _seconds(request: Request, name: str) -> float | None:
    """The query parameter ``name`` as seconds (the store checks the range)."""
    given = request.query_params.get(name)
    if not given:
        return None
    try:
        return float(given)
    except ValueError:
        raise InvalidArgument(name, f"must be a number of seconds, got {given!r}") from None


def _pretty(value: Any) -> str:
    if value is ENCRYPTED:
        return "encrypted"
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _sealed(value: Any) -> bool:
    """A value the dashboard's store cannot open (it has not the key)."""
    return value is ENCRYPTED


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=_age, when=_when, since=_since, pretty=_pretty)
    env.tests["sealed"] = _sealed
    env.globals.update(statuses=STATUSES)
    return env


class Dashboard:
    """The pages, bound to one store."""

    def __init__(self, store: TaskStore, *, allow_actions: bool, refresh: float) -> None:
        self.store = store
        # A value of an encrypted queue that the store cannot open (it has not the
        # key: $CONVEYOR_ENCRYPTION_KEYS) reads as "encrypted" on every page.
        store.internal.show_sealed()
        self.allow_actions = allow_actions
        self.refresh = refresh
        #: Which database the pages show, its password masked (in every header).
        self.database = display_url(store.url)
        self.env = _environment()

    # ------------------------------------------------------------ helpers
    def render(self, request: Request, name: str, status_code: int = 200, **ctx: Any) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        html = self.env.get_template(name).render(
            request=request,
            base=base,
            here=str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            allow_actions=self.allow_actions,
            refresh=self.refresh,
            database=self.database,
            now=datetime.now(UTC),
            **ctx,
        )
        return HTMLResponse(html, status_code=status_code)

    def failure(self, request: Request, exc: ConveyorError) -> Response:
        code = 400 if isinstance(exc, InvalidArgument) else 503
        return self.render(request, "error.html", status_code=code, message=str(exc))

    def guarded(self, handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except ConveyorError as exc:
                return self.failure(request, exc)

        return run

    # -------------------------------------------------------------- pages
    async def queues(self, request: Request) -> Response:
        stats = {s.queue: s for s in await self.store.stats()}
        settings = {s["queue"]: s for s in await self.store.queue_settings()}
        names = sorted(set(stats) | set(settings))
        plots = {}
        for name in names:
            points = await self.store.throughput(name, minutes=60)
            plots[name] = Markup(throughput_svg(points, label=name))
        overall = Markup(
            throughput_svg(
                await self.store.throughput(minutes=60), width=720, height=96, label="all queues"
            )
        )
        return self.render(
            request,
            "queues.html",
            page="queues",
            names=names,
            stats=stats,
            settings=settings,
            plots=plots,
            overall=overall,
        )

    async def groups(self, request: Request) -> Response:
        stats = {s.queue: s for s in await self.store.stats()}
        lagging_after = _seconds(request, "lagging_after")
        registered = await self.store.groups(lagging_after=lagging_after)
        by_queue: dict[str, list[Any]] = {}
        for group in registered:
            by_queue.setdefault(group.queue, []).append(group)
        return self.render(
            request,
            "groups.html",
            page="groups",
            lagging_after=lagging_after,
            by_queue=dict(sorted(by_queue.items())),
            stats=stats,
            queues=sorted(stats),
            active_names=sorted({group.name for group in registered if group.active}),
        )

    async def partitions(self, request: Request) -> Response:
        stats = await self.store.stats()
        queues = [s.queue for s in stats]
        queue = request.query_params.get("queue") or (queues[0] if queues else None)
        group = request.query_params.get("group") or None
        report = None
        groups: list[str] = []
        if queue is not None:
            report = await self.store.streams(queue, group=group, limit=20)
            groups = sorted(next((s.groups for s in stats if s.queue == queue), {}))
        return self.render(
            request,
            "partitions.html",
            page="partitions",
            queues=queues,
            queue=queue,
            group=group,
            groups=groups,
            report=report,
        )

    async def tasks(self, request: Request) -> Response:
        params = request.query_params
        search = (params.get("q") or "").strip()
        base = request.scope.get("root_path", "").rstrip("/")
        if search:
            found = await self.store.get(search) or await self.store.get_by_key(search)
            if found is not None:
                return RedirectResponse(f"{base}/tasks/{found.id}", status_code=303)
        filters = {
            key: params.get(key) or None
            for key in ("queue", "status", "name", "partition", "group")
        }
        # Newest first unless asked (order=oldest): what a person looks for is
        # what just happened.
        order: Literal["oldest", "newest"] = (
            "oldest" if params.get("order") == "oldest" else "newest"
        )
        cursor = params.get("cursor") or None
        # The cursors of the pages before this one ("-": the first page), so
        # "previous" is a keyset jump back rather than an offset.
        trail = [c for c in (params.get("trail") or "").split(",") if c][-MAX_TRAIL:]
        page = await self.store.list(limit=PAGE_SIZE, cursor=cursor, order=order, **filters)
        kept = {k: v for k, v in filters.items() if v}
        if order == "oldest":
            kept["order"] = "oldest"

        def link(**extra: str | None) -> str:
            query = {**kept, **{k: v for k, v in extra.items() if v}}
            return f"{base}/tasks" + (f"?{urlencode(query)}" if query else "")

        next_link = None
        if page.next_cursor is not None:
            next_link = link(cursor=page.next_cursor, trail=",".join([*trail, cursor or "-"]))
        prev_link = None
        if cursor is not None:
            back = trail[-1] if trail else "-"
            prev_link = link(
                cursor=None if back == "-" else back, trail=",".join(trail[:-1]) or None
            )
        queues = sorted(s.queue for s in await self.store.stats())
        flipped = {k: v for k, v in kept.items() if k != "order"}
        if order == "newest":
            flipped["order"] = "oldest"
        return self.render(
            request,
            "tasks.html",
            page="tasks",
            items=page.items,
            groups_only=await self._groups_only() if filters["group"] is None else set(),
            order=order,
            flip_link=f"{base}/tasks" + (f"?{urlencode(flipped)}" if flipped else ""),
            errors=any(t.status is Status.FAILED and t.error for t in page.items),
            filters=filters,
            queues=queues,
            search=search,
            not_found=bool(search),
            next_link=next_link,
            prev_link=prev_link,
            bulk_actions=bulk.available(filters),
            bulk_filters=bulk.form_filters(filters),
        )

    async def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        group = request.query_params.get("group") or None
        task = await self.store.get(task_id, group=group)
        if task is None:
            return self.render(request, "error.html", status_code=404, message=f"no task {task_id}")
        views = await self.store.deliveries(task_id)
        children = await self.store.children(task_id, limit=100)
        parent = None if task.parent_id is None else await self.store.get(task.parent_id)
        # On a queue consumed by groups only, queue mode's view of the task stays
        # queued for ever: the page shows the groups' views instead.
        groups_only = task.queue in await self._groups_only()
        if groups_only:
            views = [view for view in views if view.group is not None]
        nodes, edges = await self.store.dependency_graph(task_id)
        base = request.scope.get("root_path", "").rstrip("/")
        graph = Markup(dag_svg(nodes, edges, focus=task_id, base=base)) if edges else None
        return self.render(
            request,
            "task.html",
            page="tasks",
            task=task,
            group=group,
            groups_only=groups_only,
            pending=any(not view.terminal for view in views),
            views=views,
            children=children,
            parent=parent,
            retryable=RETRYABLE,
            graph=graph,
            batch=await self.store.batch_of_callback(task_id),
        )

    async def batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        info = await self.store.get_batch(batch_id)
        if info is None:
            return self.render(
                request, "error.html", status_code=404, message=f"no batch {batch_id}"
            )
        finished = sum(n for s, n in info.counts.items() if Status(s).terminal)
        return self.render(
            request, "batch.html", page="tasks", batch=info, finished=finished, statuses=STATUSES
        )

    async def _groups_only(self) -> set[str]:
        """The queues declared consumed by groups only (queue mode off)."""
        return {s["queue"] for s in await self.store.queue_settings() if not s["queue_mode"]}

    async def workers(self, request: Request) -> Response:
        found = await self.store.workers()
        return self.render(request, "workers.html", page="workers", workers=found)

    async def metrics(self, request: Request) -> Response:
        body = await metrics.store_exposition(self.store)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    # ------------------------------------------------------------ actions
    async def action(self, request: Request) -> Response:
        name = request.path_params["action"]
        if not self.allow_actions:
            return self._flash(
                request,
                "this dashboard is read-only: start it with --allow-actions to enable actions",
                ok=False,
                status_code=403,
            )
        if request.headers.get("hx-request") != "true":
            return self._flash(
                request,
                "actions are taken from the dashboard page (the HX-Request header is missing)",
                ok=False,
                status_code=400,
            )
        form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8")).items()}
        try:
            if name == "preview":
                shown = await bulk.preview(self.store, form)
                return self.render(request, "bulk_confirm.html", **shown)
            if name == "seek_preview":
                would = await seek.preview(self.store, form)
                return self.render(request, "seek_confirm.html", **would)
            if name == "seek":
                message, ok = await seek.act(self.store, form)
            elif name in bulk.ROUTES:
                message, ok = await bulk.act(self.store, name, form)
            else:
                message, ok = await self._act(name, form)
        except ConveyorError as exc:
            message, ok = f"{name} failed: {exc}", False
        return self._flash(request, message, ok=ok)

    async def _act(self, name: str, form: dict[str, str]) -> tuple[str, bool]:
        task_id = form.get("task_id", "")
        group = form.get("group") or None
        if name == "cancel":
            before = await self.store.get(task_id)
            if before is None:
                return f"no task {task_id}", False
            after = await self.store.cancel(task_id)
            if after is None or before.terminal:
                status = before.status if after is None else after.status
                return f"task {task_id} is {status} and cannot be cancelled any more", False
            return f"task {task_id} cancelled", True
        if name == "retry":
            before = await self.store.get(task_id, group=group)
            if before is None:
                return f"no task {task_id}" + (f" for group {group}" if group else ""), False
            after = await self.store.retry(task_id, group=group)
            if after is None or before.status not in RETRYABLE or after.status is not Status.QUEUED:
                status = before.status if after is None else after.status
                return (
                    f"task {task_id} is {status}: only failed, cancelled, evicted or skipped tasks "
                    "can be retried",
                    False,
                )
            return f"task {task_id} queued again", True
        if name == "subscribe":
            queue, grp = form.get("queue", ""), form.get("group", "")
            start = form.get("start") or "all"
            if start not in ("all", "new"):
                return 'start must be "all" or "new"', False
            made = await self.store.subscribe(queue, grp, start=start)  # type: ignore[arg-type]
            return f"group {made.name} subscribed to {made.queue} (start: {start})", True
        if name == "unsubscribe":
            queue, grp = form.get("queue", ""), form.get("group", "")
            if await self.store.unsubscribe(queue, grp):
                return f"group {grp} unsubscribed from {queue}", True
            return f"group {grp} was not subscribed to {queue}", False
        if name in ("pause", "resume"):
            queue = form.get("queue", "")
            changed = await getattr(self.store, name)(queue, group=group)
            what = f"{queue}" + (f" for group {group}" if group else "")
            if name == "pause":
                return (f"{what} paused" if changed else f"{what} was paused already"), changed
            return (f"{what} resumed" if changed else f"{what} was not paused"), changed
        return f"unknown action {name!r}", False

    def _flash(
        self, request: Request, message: str, *, ok: bool, status_code: int = 200
    ) -> Response:
        response = self.render(
            request, "flash.html", status_code=status_code, message=message, ok=ok
        )
        if ok:
            # The live part of the page listens for this and reloads at once.
            response.headers["HX-Trigger"] = "conveyor-changed"
        return response


def build(store: TaskStore, *, allow_actions: bool = False, refresh: float = 5.0) -> Starlette:
    """The Starlette app of the dashboard (without authentication)."""
    board = Dashboard(store, allow_actions=allow_actions, refresh=refresh)
    g = board.guarded
    routes = [
        Route("/", g(board.queues), name="queues"),
        Route("/groups", g(board.groups), name="groups"),
        Route("/partitions", g(board.partitions), name="partitions"),
        Route("/tasks", g(board.tasks), name="tasks"),
        Route("/tasks/{task_id}", g(board.task), name="task"),
        Route("/batches/{batch_id}", g(board.batch), name="batch"),
        Route("/workers", g(board.workers), name="workers"),
        Route("/metrics", g(board.metrics), name="metrics"),
        Route("/actions/{action}", g(board.action), methods=["POST"], name="action"),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.dashboard = board
    return app
