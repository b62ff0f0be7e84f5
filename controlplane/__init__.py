"""Dynamo RL control plane: Django project package.

The Celery app is imported here so `shared_task` binds to it in every process.
"""

from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
