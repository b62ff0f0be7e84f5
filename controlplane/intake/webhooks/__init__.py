"""Inbound webhooks, one package per source of events (view, event schema, fixtures)."""
