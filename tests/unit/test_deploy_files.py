"""The deploy/ files as shipped: exports need one data directory shared by the registry, the
mcp_bridge (which write them) and the dispatcher (which serves them), and the collector must
have a pipeline for every signal the services export. (Checked on the text: no YAML parser is a
dependency.)"""

from __future__ import annotations

import re
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DATA_DIR = "/var/lib/toolmesh"
SHARING = ("registry", "dispatcher", "mcp_bridge")


def _blocks(text: str, indent: int) -> dict[str, str]:
    """The blocks of `text` that start with a `name:` key at exactly `indent` spaces."""
    blocks: dict[str, str] = {}
    name = None
    key = re.compile(rf"^ {{{indent}}}([A-Za-z0-9_.-]+):")
    for line in text.splitlines():
        match = key.match(line)
        if match:
            name = match.group(1)
            blocks[name] = ""
        elif line and not line.startswith(" " * (indent + 1)) and not line.startswith("#"):
            name = None
        if name is not None:
            blocks[name] += line + "\n"
    return blocks


def _uncommented(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def test_compose_shares_one_data_volume_between_the_services_that_need_it() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    top = _blocks(text, 0)
    services = _blocks(top["services"], 2)
    for name in SHARING:
        assert f"toolmesh-data:{DATA_DIR}" in _uncommented(services[name]), name
    volumes = _blocks(top["volumes"], 2)
    assert "toolmesh-data" in volumes and "pgdata" in volumes
    # The image's data directory exists and belongs to the service user, so the named volume
    # (initialised from it) is writable.
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"TOOLMESH_DATA_DIR={DATA_DIR}" in dockerfile
    assert re.search(rf"mkdir -p {DATA_DIR} && chown toolmesh", dockerfile)


def _k8s_documents() -> list[str]:
    text = (DEPLOY / "k8s" / "toolmesh.yaml").read_text()
    return [doc for doc in re.split(r"^---$", text, flags=re.M) if doc.strip()]


def _kind_and_name(doc: str) -> tuple[str, str]:
    kind = re.search(r"^kind: (\S+)", doc, re.M)
    name = re.search(r"^metadata: \{name: ([^}]+)\}", doc, re.M)
    assert kind and name, doc
    return kind.group(1), name.group(1).strip()


def test_k8s_mounts_a_read_write_many_claim_on_the_services_that_share_data() -> None:
    docs = {_kind_and_name(doc): _uncommented(doc) for doc in _k8s_documents()}
    claim = docs[("PersistentVolumeClaim", "toolmesh-data")]
    assert "accessModes: [ReadWriteMany]" in claim
    raw = (DEPLOY / "k8s" / "toolmesh.yaml").read_text()
    assert "RWX" in raw  # the comment that a ReadWriteMany storage class is required
    config = docs[("ConfigMap", "toolmesh")]
    assert f'TOOLMESH_DATA_ROOTS: "{DATA_DIR}/files"' in config
    assert f'TOOLMESH_DATA_DIR: "{DATA_DIR}"' in config
    for name in ("registry", "dispatcher", "mcp-bridge"):
        deployment = docs[("Deployment", name)]
        assert "claimName: toolmesh-data" in deployment, name
        assert f"volumeMounts: [{{name: data, mountPath: {DATA_DIR}}}]" in deployment, name
        assert "envFrom: [{configMapRef: {name: toolmesh}}]" in deployment, name
    for name in ("sandbox", "surface"):
        assert "toolmesh-data" not in docs[("Deployment", name)], name


def test_k8s_says_headless_services_balance_per_stream() -> None:
    raw = (DEPLOY / "k8s" / "toolmesh.yaml").read_text()
    assert "per call" not in raw.replace("not per call", "")
    assert "per\n  # stream" in raw or "per stream" in raw


def test_the_collector_has_a_pipeline_for_traces_and_for_metrics() -> None:
    text = (DEPLOY / "otel-collector.yaml").read_text()
    pipelines = _blocks(_blocks(_blocks(text, 0)["service"], 2)["pipelines"], 4)
    for signal in ("traces", "metrics"):
        assert "receivers: [otlp]" in pipelines[signal], signal
        assert "exporters: [debug]" in pipelines[signal], signal
