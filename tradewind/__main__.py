"""`python -m tradewind ...` is the `tradewind` command."""

from tradewind.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
