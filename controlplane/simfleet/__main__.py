"""`python -m controlplane.simfleet --workers 12 --namespaces rl-a,rl-b --prefix rl`."""

from controlplane.simfleet.cli import main

if __name__ == "__main__":
    main()
