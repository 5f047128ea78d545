// The live part of each page (#live) is fetched again every few seconds and
// swapped in whole. A click is a press and a release on the same element: a swap
// landing between the two replaces the element under the pointer and the click
// never happens (a link that does nothing). So a swap waits while a pointer is
// down: it is skipped, and the next refresh brings the page up to date.
(function () {
  "use strict";
  var down = 0;
  addEventListener("pointerdown", function () { down += 1; }, true);
  addEventListener("pointerup", function () {
    // After the click the release leads to has been dispatched.
    setTimeout(function () { down = Math.max(0, down - 1); }, 0);
  }, true);
  addEventListener("pointercancel", function () { down = 0; }, true);
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (down > 0 && target && target.id === "live") {
      event.detail.shouldSwap = false;
    }
  });
})();
