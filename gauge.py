"""Reproduce the RMSNorm scale-gauge claims: ``python gauge.py --help``. No logic here."""

import sys

try:  # the imports take seconds: Ctrl-C meanwhile is one line and exit 130, like Ctrl-C later
    from gauge.__main__ import main
except KeyboardInterrupt:
    sys.stderr.write("python gauge.py: interrupted\n")
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())
