"""Reproduce the RMSNorm scale-gauge claims: ``python gauge.py --help``. No logic here."""

from gauge.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
