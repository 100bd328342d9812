"""What a service imports before it can announce readiness: heavy libraries only some calls
need (the anthropic SDK: ~5 s of imports here; Alembic) are imported on first use, and the SDK
is warmed in the background only when LLM credentials are configured."""

from __future__ import annotations

import subprocess
import sys

from shared.llm import client

SERVICES = ("registry", "dispatcher", "sandbox", "mcp_bridge", "surface")


def test_no_service_module_imports_the_llm_sdk_or_alembic() -> None:
    code = (
        f"import sys; [__import__(f'services.{{s}}.__main__') for s in {SERVICES!r}]; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'anthropic', 'alembic'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_sdk_is_warmed_in_the_background_only_with_credentials() -> None:
    assert client.warm_up({}) is None
    thread = client.warm_up({"ANTHROPIC_API_KEY": "k"})
    assert thread is not None and thread.daemon
    thread.join(120)
    assert "anthropic" in sys.modules
