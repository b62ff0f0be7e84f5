"""Trainer webhooks: "checkpoint ready" events that start (or propose) a policy refresh."""
