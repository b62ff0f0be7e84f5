# The real OpenID provider and the control plane configured for it, one of each per module.
from tests.integration.accounts.sso_flow import control_plane, provider  # noqa: F401
