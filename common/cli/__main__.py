"""`python -m common.cli`: the `starling` command without an installed entry point."""

from common.cli.main import run

if __name__ == "__main__":
    run()
