"""`Authorization: Bearer <api key>` authentication."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from gpucloud.lib.http import client_ip
from gpucloud.tenancy.selectors import member_permissions
from gpucloud.tenancy.services import api_key_check, api_key_touch


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts:
            # A header of only whitespace (NBSP and friends split away to nothing).
            raise exceptions.AuthenticationFailed("Use the header `Authorization: Bearer <api key>`.")
        if parts[0].lower() != self.keyword.lower():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Use the header `Authorization: Bearer <api key>`.")
        key = api_key_check(raw=parts[1])
        if key is None:
            raise exceptions.AuthenticationFailed("This API key is unknown, revoked or expired.")
        # The one rule of every face (an active member of the key's tenant), so a key dies with
        # its creator's account or membership even before anything revokes it.
        if not member_permissions(membership=key.membership, scopes=key.scopes):
            raise exceptions.AuthenticationFailed(
                "The user who created this API key is disabled or no longer a member of its tenant.")
        api_key_touch(key=key, ip=client_ip(request))
        # The underlying Django request carries the key so throttles and views can see it.
        request._request.api_key = key
        return key.created_by, key

    def authenticate_header(self, request):
        return f'{self.keyword} realm="api"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents the Bearer scheme in the OpenAPI schema (lives here so it loads with the class)."""

    target_class = "gpucloud.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A gpucloud API key: `Authorization: Bearer gpc_…`"}
