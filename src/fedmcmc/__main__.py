"""``python -m fedmcmc``: the command line (:mod:`fedmcmc.app.cli`)."""

from fedmcmc.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
