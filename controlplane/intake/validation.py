"""Small URL helpers shared by the intake services."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def literal_host(url: str) -> bool:
    """Whether the URL's host is an IP literal (judged at save time without DNS)."""
    try:
        ipaddress.ip_address((urlsplit(url).hostname or "").split("%", 1)[0])
    except ValueError:
        return False
    return True
