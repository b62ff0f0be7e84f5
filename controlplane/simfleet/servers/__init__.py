"""The three HTTP surfaces of a simulated deployment plus the `/_sim/` control API."""
