"""API keys of the dispatcher: only digests stored, bearer tokens checked, principals scoped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.auth import ApiKeys, Principal, key_digest
from shared.errors import InvalidArgument, PermissionDenied, Unauthenticated


def write(tmp_path: Path, payload: object) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(payload))
    return path


def test_a_bearer_key_maps_to_its_principal(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "keys": [
                {
                    "key_sha256": key_digest("s3cret"),
                    "tenant_id": "acme",
                    "capabilities": ["analyst"],
                    "name": "backend",
                }
            ]
        },
    )
    keys = ApiKeys.load(path)
    principal = keys.authenticate([("authorization", "Bearer s3cret")])
    assert principal == Principal("backend", "acme", frozenset({"analyst"}), False)
    assert "s3cret" not in path.read_text()  # only the digest is stored
    assert principal.tenant_for("other") == "acme"
    assert principal.capabilities_for(["analyst", "admin"]) == ["analyst"]
    with pytest.raises(PermissionDenied, match="admin key"):
        principal.require_admin("adding a rule")
    admin = Principal("ops", "ops", None, True)
    assert admin.tenant_for("acme") == "acme" and admin.tenant_for("") == "ops"
    assert admin.capabilities_for(["x", "x"]) == ["x"]
    assert admin.capabilities_for(["telemetry_admin"]) == ["telemetry_admin"]


def test_a_key_without_a_capability_list_may_not_claim_another_tenants_data() -> None:
    """Any tenant key (most have no list) read every tenant's telemetry by claiming
    telemetry_admin."""
    open_key = Principal("backend", "acme", None, False)
    assert open_key.capabilities_for(["analyst", "telemetry_admin"]) == ["analyst"]
    assert open_key.not_allowed(["telemetry_admin", "x"]) == ["telemetry_admin"]
    listed = Principal("sre", "acme", frozenset({"telemetry_admin"}), False)
    assert listed.capabilities_for(["telemetry_admin"]) == ["telemetry_admin"]


@pytest.mark.parametrize(
    "metadata",
    [
        [],
        [("authorization", "Basic s3cret")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer wrong")],
    ],
)
def test_missing_or_unknown_keys_are_unauthenticated(tmp_path: Path, metadata: list) -> None:
    keys = ApiKeys.load(
        write(tmp_path, {"keys": [{"key_sha256": key_digest("s3cret"), "tenant_id": "a"}]})
    )
    with pytest.raises(Unauthenticated):
        keys.authenticate(metadata)


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"keys": "x"},
        {"keys": [{"key_sha256": "abc", "tenant_id": "a"}]},
        {"keys": [{"key_sha256": "0" * 64}]},
    ],
)
def test_a_malformed_keys_file_is_refused_with_what_is_wrong(
    tmp_path: Path, payload: object
) -> None:
    with pytest.raises(InvalidArgument, match="API keys file"):
        ApiKeys.load(write(tmp_path, payload))
    with pytest.raises(InvalidArgument, match="API keys file"):
        ApiKeys.load(tmp_path / "missing.json")
