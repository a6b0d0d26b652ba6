"""Builds that take the host's trust (`corral.sandbox.buildkit`): the host's CA bundle and pip
index settings reach every `RUN` as BuildKit secrets served from this process, and none of
them stays in the image."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from corral.errors import ImageBuildError
from corral.sandbox.buildkit import CA_TARGET, HostTrust, build_with_host_trust, host_trust
from corral.sandbox.buildkit import rewrite_runs
from corral.sandbox.builds import build_image

MOUNTS = "--mount=type=secret,id=corral-ca"


def test_every_run_gets_the_mounts_and_nothing_else_changes() -> None:
    text = ("# escape=`\nFROM x\nrun echo a `\n  # a comment inside\n  RUN-not-an-instruction\n"
            "RUN [\"sh\", \"-c\", \"true\"]\nONBUILD RUN make\nENV RUN=1\n")
    out = rewrite_runs(text).splitlines()
    assert out[2].startswith(f"run {MOUNTS}") and out[2].endswith("echo a `")
    assert out[3:5] == ["  # a comment inside", "  RUN-not-an-instruction"]  # continued
    assert out[5].startswith(f"RUN {MOUNTS}") and out[5].endswith('["sh", "-c", "true"]')
    assert out[6:] == ["ONBUILD RUN make", "ENV RUN=1"]
    staged = rewrite_runs("FROM a AS b\nRUN x\nFROM c \\\n  AS d\n", ca_args=True).splitlines()
    assert staged[1] == "ARG SSL_CERT_FILE" and staged[9:11] == ["  AS d", "ARG SSL_CERT_FILE"]


def test_the_hosts_pip_settings_are_read_and_its_own_paths_dropped(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://u:tok@pypi.corp.example/simple\n"
                    "extra-index-url = file:///opt/pypi http://mirror.example/simple\n"
                    "[install]\ntrusted-host = mirror.example\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("CA")
    trust = host_trust({"HOME": str(tmp_path), "XDG_CONFIG_DIRS": str(tmp_path / "none"),
                        "PIP_CONFIG_FILE": str(conf), "PIP_CERT": str(ca)})
    assert trust == HostTrust(ca, "https://u:tok@pypi.corp.example/simple",
                              ["http://mirror.example/simple"], ["mirror.example"])
    assert trust.pip_conf().splitlines()[1] == f"cert = {CA_TARGET}"


def test_a_build_reads_the_hosts_trust_as_secrets_that_stay_out_of_the_image(
        tmp_path: Path, base_image: str) -> None:
    nonce = secrets.token_hex(4)  # a RUN BuildKit has cached would read no secret
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\nUSER nobody\n"
        f"RUN : {nonce} && sha256sum {CA_TARGET} | cut -c1-64 > /tmp/ca.sha && \\\n"
        "    grep -c '^index-url = https://u:s[3]cret@' /etc/xdg/pip/pip.conf >/tmp/index.seen \\\n"
        "    && echo \"$SSL_CERT_FILE,$PIP_CERT\" > /tmp/vars\n")
    ca = tmp_path / "host-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    trust = HostTrust(ca, "https://u:s3cret@pypi.corp.example/simple")
    tag = f"corral/test-trust:{nonce}"
    with pytest.raises(ImageBuildError, match=r"Dockerfile: build failed at Step 3/\d : RUN : "
                                              r"\w+ && sha256sum"):
        build_image(tmp_path / "Dockerfile", host_trust=False)  # the classic builder: no secrets
    try:
        served = build_with_host_trust(tmp_path / "Dockerfile", tmp_path, tag, trust=trust)
        assert sorted(set(served)) == ["corral-ca", "corral-pip"]
        seen = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "sh", "-c",
                               f"cat /tmp/ca.sha /tmp/index.seen /tmp/vars; cat {CA_TARGET} "
                               "/etc/xdg/pip/pip.conf 2>/dev/null | wc -c"],
                              capture_output=True, text=True, check=True).stdout.split()
        sha = subprocess.run(["sha256sum", str(ca)], capture_output=True, text=True).stdout
        # read by a non-root RUN, told by the variables tools read; empty in the image
        assert seen == [sha[:64], "1", f"{CA_TARGET},{CA_TARGET}", "0"]
        env = subprocess.run(["docker", "inspect", "--format", "{{json .Config.Env}}", tag],
                             capture_output=True, text=True, check=True).stdout
        assert "SSL_CERT_FILE" not in env  # a build arg, not the image's environment
        history = subprocess.run(["docker", "history", "--no-trunc", tag], capture_output=True,
                                 text=True, check=True).stdout
        assert "s3cret" not in history and "not really" not in history
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
