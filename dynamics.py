"""Reproduce the weight-norm dynamics claims: ``python dynamics.py --help``. No logic here."""

from dynamics.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
