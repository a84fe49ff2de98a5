"""The container image and the compose file.

The image is ``deploy/Dockerfile`` built by ``deploy/image.sh`` (``make image``) with podman on a
Debian base made by mmdebstrap (no container registry involved), then started once against the
loopback fakes with host networking: it answers ``/readyz``, its HEALTHCHECK passes, it runs as
the unprivileged ``gateway`` user, a web chat turn is answered, Debian's Chromium in it opens a
page for the browser tool, and SIGTERM stops it cleanly. Building takes one to two minutes (a few
seconds with podman's layer cache), so these tests run in CI (``CI`` set; podman and mmdebstrap
are required there, ``.ci/run`` installs them) or with ``GATEWAY_TEST_IMAGE=1``, and are skipped
otherwise.

The compose file (two instances on PostgreSQL) is checked with Docker Compose's own validator
(``docker-compose config``, Debian package ``docker-compose``: the compose schema and service
references) and with podman-compose; skipped where they are missing, except in CI.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.web_client import WebClient

ROOT = Path(__file__).resolve().parent.parent
IMAGE_SH = ROOT / "deploy" / "image.sh"
IMAGE = os.environ.get("IMAGE", "localhost/agent-gateway:latest")
IN_CI = bool(os.environ.get("CI"))
BUILD_IMAGE = IN_CI or bool(os.environ.get("GATEWAY_TEST_IMAGE"))

pytestmark = pytest.mark.timeout(1800)  # the first image test builds the image
image_only = pytest.mark.skipif(not BUILD_IMAGE, reason="builds the container image (minutes): runs in CI or with "
                                                        "GATEWAY_TEST_IMAGE=1 (needs podman and mmdebstrap, as root)")


def image_sh(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``deploy/image.sh ARGS``; output captured, stderr shown in the failure."""
    result = subprocess.run([str(IMAGE_SH), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"deploy/image.sh {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.fixture(scope="module")
def image() -> str:
    """Builds the image (base tarball and layers from the cache when present); its name."""
    build = image_sh("build", timeout=1500)
    print(build.stderr[-600:])  # the script's timings and the image size (shown with -s / -rP)
    return IMAGE


@pytest.fixture(scope="module")
def container(image: str, fake_openai, page_server) -> Iterator[dict[str, object]]:
    """The image started with host networking, pointed at the fake model; waits for ``/readyz``."""
    name = f"agent-gateway-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {
        "GATEWAY__HTTP__HOST": "127.0.0.1",  # host networking: only loopback, on a free port
        "GATEWAY__HTTP__PORT": str(port),
        "GATEWAY__LLM__BASE_URL": f"{fake_openai.url}/v1",
        "GATEWAY__LLM__MAX_RETRIES": "0",
        "OPENAI_API_KEY": "sk-test",
        "GATEWAY__ACCESS__MODE": "open",  # the example config's allowlist would answer with a pairing code
        "GATEWAY__MEMORY__PROMOTE": "false",  # no extra model call after the turn
        "GATEWAY__TOOLS__BROWSER_ALLOW_PRIVATE": "true",  # the test page is on loopback
    }
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        # --timeout: a container left behind by a killed test run ends by itself.
        image_sh("run", "-d", "--name", name, "--network", "host", "--timeout", "1200", *env_args, image,
                 timeout=120)
        deadline = time.monotonic() + 180
        while http_status(f"{base}/readyz") != 200:
            state = image_sh("podman", "inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                logs = image_sh("podman", "logs", name, check=False)
                raise AssertionError(f"the container did not become ready ({state}):\n{logs.stdout[-3000:]}"
                                     f"{logs.stderr[-3000:]}")
            time.sleep(0.25)
        print(f"image: /readyz answered 200 {time.monotonic() - started:.1f} s after podman run")
        yield {"name": name, "base": base}
    finally:
        image_sh("podman", "rm", "--force", "--time", "5", name, check=False, timeout=60)


@image_only
def test_the_image_is_ready_healthy_and_unprivileged(image, container):
    inspect = yaml.safe_load(image_sh("podman", "image", "inspect", image).stdout)[0]
    config = inspect["Config"]
    assert config["User"] == "gateway"
    assert "8080/tcp" in config["ExposedPorts"]
    assert "/readyz" in " ".join(inspect["Healthcheck"]["Test"])  # kept: built with --format docker
    name = str(container["name"])
    # The image's own HEALTHCHECK command, run inside the container.
    health = image_sh("podman", "healthcheck", "run", name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    assert image_sh("podman", "exec", name, "id", "-u").stdout.strip() == "10001"
    tools = image_sh("podman", "exec", name, "sh", "-c", "chromium --version && bwrap --version").stdout
    assert "Chromium" in tools and "bubblewrap" in tools


@image_only
async def test_a_web_chat_turn_is_answered_by_the_container(container, fake_openai):
    fake_openai.reset()
    fake_openai.script(oa.text("Hello from the container image."))
    page = WebClient(str(container["base"]))
    try:
        await page.open()
        page.listen()
        response = await page.say("hi there")
        assert response.status == 200
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=60, what="answer row")
        assert page.of("row", lambda e: e["role"] == "assistant")[0]["text"] == "Hello from the container image."
        assert "hi there" in fake_openai.requests[0]["json"]["messages"][-1]["content"]
    finally:
        await page.close()


@image_only
async def test_the_browser_tool_drives_the_images_chromium(container, fake_openai, page_server):
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("browser_open", {"url": f"{page_server.url}/page"})),
                       oa.text("The codename is amber-falcon-42."))
    page = WebClient(str(container["base"]))
    try:
        await page.open()
        page.listen()
        assert (await page.say("what is the codename on that page?")).status == 200
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=90, what="answer row")
        tool_results = [m["content"] for m in fake_openai.requests[-1]["json"]["messages"] if m["role"] == "tool"]
        assert len(tool_results) == 1 and "Codename: amber-falcon-42" in tool_results[0], tool_results
    finally:
        await page.close()


@image_only
def test_sigterm_stops_the_container_cleanly(container):
    name = str(container["name"])
    image_sh("podman", "stop", "--time", "60", name, timeout=90)
    state = image_sh("podman", "inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    assert state == "0", image_sh("podman", "logs", "--tail", "30", name, check=False).stderr


# ------------------------------------------------------------------------------ compose file


def compose_tool(tool: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))
    if path is None:
        if IN_CI:
            pytest.fail(f"{tool} is required in CI (.ci/run installs it)")
        pytest.skip(f"{tool} is not installed")
    return path


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """deploy/ as an operator sets it up: .env from env.example, gateway.toml beside the compose file."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    for name in ("docker-compose.yml", "Caddyfile", "Dockerfile"):
        shutil.copy(ROOT / "deploy" / name, deploy / name)
    shutil.copy(ROOT / "deploy" / "gateway.example.toml", deploy / "gateway.toml")
    env = (ROOT / "deploy" / "env.example").read_text().replace("POSTGRES_PASSWORD=", "POSTGRES_PASSWORD=pw-0001")
    (deploy / ".env").write_text(env)
    return deploy


def compose_config(tool: str, deploy: Path, file: str = "docker-compose.yml") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_PASSWORD", "PUBLIC_HOST")}
    return subprocess.run([compose_tool(tool), "-f", file, "config"], cwd=deploy, capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_the_compose_file_is_valid_with_two_instances_on_postgresql(deploy_copy):
    result = compose_config("docker-compose", deploy_copy)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert set(services) == {"postgres", "migrate", "gateway-1", "gateway-2", "proxy"}
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    ids = set()
    for name in ("gateway-1", "gateway-2"):
        service = services[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        environment = service["environment"]
        assert environment["GATEWAY__DATABASE__URL"] == "postgresql+psycopg://gateway:pw-0001@postgres:5432/gateway"
        ids.add(environment["GATEWAY__INSTANCE_ID"])
    assert ids == {"gateway-1", "gateway-2"}

    podman = compose_config("podman-compose", deploy_copy)
    assert podman.returncode == 0, podman.stderr
    assert set(yaml.safe_load(podman.stdout)["services"]) == set(services)


def test_the_compose_check_rejects_a_broken_file(deploy_copy):
    """The validator is not a YAML parser only: an unknown key and a dangling dependency fail."""
    text = (deploy_copy / "docker-compose.yml").read_text()
    (deploy_copy / "typo.yml").write_text(text.replace("    healthcheck:", "    helthcheck:", 1))
    (deploy_copy / "dangling.yml").write_text(text.replace("      postgres:\n", "      postgress:\n", 1))
    for file, error in (("typo.yml", "helthcheck"), ("dangling.yml", "postgress")):
        result = compose_config("docker-compose", deploy_copy, file)
        assert result.returncode != 0 and error in result.stderr, result.stderr
    missing = deploy_copy / ".env"
    missing.write_text(missing.read_text().replace("POSTGRES_PASSWORD=pw-0001", "POSTGRES_PASSWORD="))
    result = compose_config("docker-compose", deploy_copy)
    assert result.returncode != 0 and "set POSTGRES_PASSWORD in deploy/.env" in result.stderr, result.stderr
