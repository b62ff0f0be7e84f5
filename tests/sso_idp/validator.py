from oauth2_provider.oauth2_validators import OAuth2Validator

from tests.sso_idp import tweaks


class GroupsValidator(OAuth2Validator):
    """Adds the person's name, email and groups (the claim the control plane maps to roles)."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "profile"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def get_id_token_dictionary(self, token, token_handler, request):
        # These claims are laid over oauthlib's own (aud, iat), so a tweak replaces those too.
        claims, expiration_time = super().get_id_token_dictionary(token, token_handler, request)
        return tweaks.apply(request.user.username, claims), expiration_time
