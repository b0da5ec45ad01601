"""Pull failures in words (agents/host/pullerrors.py): engine error texts as docker-py raises
them (str of docker.errors.APIError / NotFound). The first three were taken from this machine's
engine (no registry reachable); the rest are the engine's and registries' documented texts."""
from __future__ import annotations

import pytest

from agents.host.pullerrors import start_error_cause, start_error_reason

API = "500 Server Error for http+docker://localhost/v1.41/images/create?tag=1&fromImage=x: Internal Server Error"
TABLE = [
    # registry unreachable
    (f'{API} ("Get "https://registry.invalid/v2/": dial tcp: lookup registry.invalid on 10.255.255.53:53: '
     'no such host")', "unreachable"),
    (f'{API} ("Get "http://localhost:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused")', "unreachable"),
    (f'{API} ("Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: '
     'no such host")', "unreachable"),
    (f'{API} ("Get "https://registry-1.docker.io/v2/": net/http: request canceled while waiting for connection '
     '(Client.Timeout exceeded while awaiting headers)")', "unreachable"),
    (f'{API} ("Get "https://r.example.com/v2/": net/http: TLS handshake timeout")', "unreachable"),
    (f'{API} ("Get "https://r.example.com/v2/": x509: certificate signed by unknown authority")', "unreachable"),
    # not found
    ('404 Client Error for http+docker://localhost/v1.41/images/create?tag=nope&fromImage=busybox: Not Found '
     '("manifest for busybox:nope not found: manifest unknown: manifest unknown")', "not_found"),
    ('404 Client Error for http+docker://localhost/v1.41/images/create?tag=1&fromImage=nosuch%2Frepo: Not Found '
     '("pull access denied for nosuch/repo, repository does not exist or may require \'docker login\': denied: '
     'requested access to the resource is denied")', "not_found"),
    (f'{API} ("Head "https://ghcr.io/v2/x/y/manifests/1": denied: requested access to the resource is denied")',
     "not_found"),
    # unauthorized
    (f'{API} ("Head "https://r.example.com/v2/team/app/manifests/1": unauthorized: authentication required")',
     "unauthorized"),
    (f'{API} ("Get "https://r.example.com/v2/team/app/manifests/1": no basic auth credentials")', "unauthorized"),
    (f'{API} ("Head "https://ghcr.io/v2/team/app/manifests/1": unauthorized")', "unauthorized"),
    # disk full (the host's, not the image's fault)
    (f'{API} ("failed to register layer: write /var/lib/docker/vfs/dir/abc/usr/lib/libcuda.so: '
     'no space left on device")', "disk_full"),
    (f'{API} ("failed to copy: write /var/lib/docker/tmp/GetImageBlob123: no space left on device")', "disk_full"),
    # rate limit, malformed
    (f'{API} ("toomanyrequests: You have reached your pull rate limit. You may increase the limit by '
     'authenticating and upgrading")', "rate_limited"),
    ('400 Client Error for http+docker://localhost/v1.41/containers/create: Bad Request ("invalid reference '
     'format")', "bad_reference"),
    # anything else stays as the engine said it
    ('500 Server Error for http+docker://localhost/v1.41/containers/abc/start: Internal Server Error ("failed to '
     'create task for container: OCI runtime create failed: runc create failed: /proc cannot be mounted")', None),
]
WORDS = {"unreachable": "cannot be reached from the host", "not_found": "image not found: check the name and tag",
         "unauthorized": "add credentials", "disk_full": "disk is full", "rate_limited": "rate limit",
         "bad_reference": "malformed"}


@pytest.mark.parametrize(("text", "cause"), TABLE)
def test_an_engine_error_is_told_as_its_cause_with_the_engines_words_after_it(text, cause):
    assert start_error_cause(text) == cause
    reason = start_error_reason("r.example.com/team/app:1", text)
    if cause is None:
        assert reason == text
        return
    assert reason.startswith("r.example.com/team/app:1: ") and WORDS[cause] in reason
    assert "(engine: " in reason and len(reason) < 500  # fits a workload's reason
