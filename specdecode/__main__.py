import sys

try:  # an interrupt while the command line's module loads is the same quiet exit as one later (cli/main.py)
    from specdecode.cli.main import main
except KeyboardInterrupt:
    sys.exit(130)

sys.exit(main())
