"""API keys: who is calling. With TOOLMESH_API_KEYS_FILE set, every service checks them: each
call (health and reflection aside) needs `authorization: Bearer <key>` with a known key.
At the dispatcher (the mesh's edge) the key's principal decides the tenant (a request's own
tenant_id is overwritten, never trusted), caps the capabilities a call may claim, and scopes the
log, events, cancellation and policy administration. The registry, sandbox, mcp_bridge and
surface check keys with shared.server.MeshAuth: their administrative and mesh-internal RPCs
(the registry's tool writes and ExecuteTool, the sandbox's Execute, every mcp_bridge RPC, the
surface's DeriveTier0, UpsertModelConfig and GetWorkingSet) need an admin key, and elsewhere a
non-admin key must name a tenant it may act for (PERMISSION_DENIED otherwise) and claim only
capabilities it may; the services call each other with their own admin key
(TOOLMESH_API_KEY). Without the file every service runs open (a trusted mesh, or development):
the request's tenant_id is taken as given.

The keys file is JSON — only SHA-256 digests of keys are stored, never the keys:

    {"keys": [
      {"name": "agent-backend", "key_sha256": "<hex>", "tenant_id": "acme",
       "capabilities": ["analyst"], "admin": false}
    ]}

`capabilities` omitted means the caller may claim any but those that reach other tenants' data
(CROSS_TENANT_CAPABILITIES: `telemetry_admin`), which a non-admin key claims only when its entry
lists them; `admin` may act for every tenant and manage policy rules. `toolmesh keys hash KEY`
prints a key's digest."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import InvalidArgument, PermissionDenied, Unauthenticated

AUTH_HEADER = "authorization"
# Capabilities that reach other tenants' data (query_telemetry of another tenant): a non-admin
# key claims them only when its entry lists them, never by omitting its capability list.
CROSS_TENANT_CAPABILITIES = frozenset({"telemetry_admin"})


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    tenant_id: str
    capabilities: frozenset[str] | None = None  # None: may claim any
    admin: bool = False

    def tenant_for(self, requested: str) -> str:
        """The tenant a call runs as: the key's, unless an admin names another."""
        return requested if self.admin and requested else self.tenant_id

    def capabilities_for(self, requested: Sequence[str]) -> list[str]:
        """The capabilities of `requested` this key may claim (the others are dropped)."""
        return sorted(set(requested) - set(self.not_allowed(requested)))

    def not_allowed(self, claimed: Sequence[str]) -> list[str]:
        """The capabilities of `claimed` this key may not claim: those its entry does not
        list, or, without a list, those reaching other tenants' data (unless it is admin)."""
        if self.capabilities is not None:
            return sorted(set(claimed) - self.capabilities)
        if self.admin:
            return []
        return sorted(set(claimed) & CROSS_TENANT_CAPABILITIES)

    def may_act_for(self, tenant: str) -> bool:
        """Its own tenant, or any tenant for an admin ("*", every tenant, is admin-only)."""
        return self.admin or tenant == self.tenant_id

    def require_tenant(self, tenant: str, what: str) -> None:
        if not self.may_act_for(tenant):
            raise PermissionDenied(
                f"{what} for tenant {tenant!r} is not allowed for the API key {self.name!r}, "
                f"which acts for tenant {self.tenant_id!r} only",
                reason="TENANT_NOT_ALLOWED",
                metadata={"tenant_id": tenant, "key": self.name},
            )

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise PermissionDenied(
                f"{what} needs an admin key; {self.name!r} is not one", reason="ADMIN_REQUIRED"
            )


class ApiKeys:
    """The principals by key digest."""

    def __init__(self, principals: Mapping[str, Principal]) -> None:
        self._by_digest = dict(principals)

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        try:
            raw: Any = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidArgument(f"API keys file {path}: {exc}") from exc
        entries = raw.get("keys") if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            raise InvalidArgument(f'API keys file {path}: expected {{"keys": [...]}}')
        principals: dict[str, Principal] = {}
        for i, entry in enumerate(entries):
            digest = str(entry.get("key_sha256", "")).lower() if isinstance(entry, dict) else ""
            tenant = entry.get("tenant_id") if isinstance(entry, dict) else None
            if len(digest) != 64 or not isinstance(tenant, str) or not tenant:
                raise InvalidArgument(
                    f"API keys file {path}: entry {i} needs key_sha256 (64 hex digits) and "
                    "tenant_id"
                )
            caps = entry.get("capabilities")
            principals[digest] = Principal(
                name=str(entry.get("name") or f"key{i}"),
                tenant_id=tenant,
                capabilities=None if caps is None else frozenset(str(c) for c in caps),
                admin=bool(entry.get("admin", False)),
            )
        return cls(principals)

    def authenticate(self, metadata: Sequence[tuple[str, Any]] | None) -> Principal:
        header = ""
        for key, value in metadata or ():
            if key == AUTH_HEADER and isinstance(value, str):
                header = value
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated(
                "this service requires an API key: send 'authorization: Bearer <key>' (the "
                "CLI sends TOOLMESH_API_KEY)",
                reason="API_KEY_MISSING",
            )
        digest = key_digest(token.strip())
        for known, principal in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("unknown API key", reason="API_KEY_UNKNOWN")
