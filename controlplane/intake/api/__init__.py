"""The JSON API under `/api/v1/`: one NinjaAPI (`site.py`), its routers, its error bodies and
its URLs.

OpenAPI 3 at `/api/v1/openapi.json`, human docs at `/api/v1/docs`. Authentication is a bearer
token or the browser session (CSRF on unsafe methods); the machine endpoints (webhooks) carry
their own signature auth.
"""
