# The real OpenID provider and the control plane configured for it, one of each per module.
from tests.integration.accounts.sso_flow import (  # noqa: F401
    control_plane,
    provider,
    provider_env,
)
