"""The ``mmq`` console command that ``pip install`` puts on PATH: the native command line itself
(the same parser and code as the ``mmq`` binary that ``cargo install --path cli`` builds), run
inside this process."""

from __future__ import annotations

import signal
import sys

from . import _mmq


def main() -> None:
    # Ctrl-C stops the command at once, as it stops the native binary; outputs are written to a
    # temporary file and renamed into place, so nothing half-written is left.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(_mmq.cli_main(["mmq", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
