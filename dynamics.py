"""Reproduce the weight-norm dynamics claims: ``python dynamics.py --help``. No logic here."""

import sys

try:  # the imports take seconds: Ctrl-C meanwhile is one line and exit 130, like Ctrl-C later
    from dynamics.__main__ import main
except KeyboardInterrupt:
    sys.stderr.write("python dynamics.py: interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())
