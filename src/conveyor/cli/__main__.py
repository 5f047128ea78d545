"""``python -m conveyor.cli``."""

from conveyor.cli.main import main

main()
