"""Group → role mapping for single sign-on, read from settings and applied at every sign-in.

Plain functions with no Django models, so settings can parse the mapping at start-up and a bad
value stops the process with a message naming the variable.
"""

from collections.abc import Iterable, Mapping

from django.core.exceptions import ImproperlyConfigured

from controlplane.accounts.roles import Role

#: Highest first: a person in several mapped groups gets the most capable of their roles.
RANK = (Role.ADMIN, Role.APPROVER, Role.OPERATOR, Role.VIEWER)


def parse_role_map(items: Iterable[str], name: str) -> dict[str, Role]:
    """`["rl-admins=admin", "rl-ops=operator"]` → `{"rl-admins": Role.ADMIN, ...}`."""
    mapping: dict[str, Role] = {}
    for item in items:
        group, sep, role = item.rpartition("=")
        group, role = group.strip(), role.strip()
        if not sep or not group:
            raise ImproperlyConfigured(f"{name}: {item!r} is not `group=role`")
        try:
            mapping[group] = Role(role)
        except ValueError:
            roles = ", ".join(r.value for r in Role)
            raise ImproperlyConfigured(f"{name}: {role!r} is not a role ({roles})") from None
    return mapping


def groups_from_claim(value: object) -> list[str]:
    """A groups claim as a list of names: providers send a list, some a single string."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def role_for_groups(groups: Iterable[str], role_map: Mapping[str, Role]) -> Role | None:
    """The highest role any of `groups` maps to, or None when none is mapped."""
    granted = {role_map[g] for g in groups if g in role_map}
    return next((role for role in RANK if role in granted), None)
