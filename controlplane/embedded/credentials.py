"""Demo users: one per role, with generated passwords kept in ./var so restarts reuse them."""

import json
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role, set_role


def ensure_demo_users(var_dir: Path) -> dict[str, tuple[str, str]]:
    """Return {role: (username, password)}, creating or repairing users as needed."""
    path = var_dir / "demo-users.json"
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    User = get_user_model()
    result = {}
    for role in Role:
        username = f"demo-{role.value}"
        password = stored.get(username) or secrets.token_urlsafe(12)
        user = User.objects.filter(username=username).first()
        if user is None:
            create_user_with_role(username, role, password, validate=False)
        else:
            if not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            if not user.groups.filter(name=role.value).exists():
                set_role(user, role)
        stored[username] = password
        result[role.value] = (username, password)
    path.write_text(json.dumps(stored, indent=2))
    path.chmod(0o600)
    return result
