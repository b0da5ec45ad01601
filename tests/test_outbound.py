"""The outbound guard (gpucloud/lib/outbound.py): which URLs the control plane may call, and how.

Real sockets on 127.0.0.1 only. The guard's `resolve` is replaced where a test needs a name to
answer something else: that is a stand-in for DNS, not for our code.
"""
from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpucloud.lib import outbound
from gpucloud.lib.outbound import OutboundError, OutboundRefused, outbound_check, outbound_post

# (url, allowed without WEBHOOK_ALLOW_PRIVATE, allowed with it)
TABLE = [
    ("https://8.8.8.8/hook", True, True),
    ("https://[2606:4700:4700::1111]/hook", True, True),
    ("http://8.8.8.8/hook", False, True),  # plain http only for demos
    ("https://127.0.0.1:8000/", False, True),
    ("https://localhost:6379/", False, True),
    ("https://[::1]/", False, True),
    ("https://10.0.0.1/", False, True),
    ("https://172.16.5.4/", False, True),
    ("https://192.168.1.1/", False, True),
    ("https://100.64.0.1/", False, True),  # CGNAT
    ("https://[fd12:3456::1]/", False, True),  # unique-local
    ("https://[::ffff:127.0.0.1]/", False, True),  # IPv4-mapped loopback
    ("https://2130706433/", False, True),  # 127.0.0.1 written as a number
    ("https://169.254.169.254/latest/meta-data/", False, False),  # cloud metadata: never
    ("http://169.254.169.254/", False, False),
    ("https://[::ffff:169.254.169.254]/", False, False),
    ("https://[64:ff9b::a9fe:a9fe]/", False, False),  # NAT64 of 169.254.169.254
    ("https://[2002:a9fe:a9fe::1]/", False, False),  # 6to4 of 169.254.169.254
    ("https://[fd00:ec2::254]/", False, False),  # AWS metadata over IPv6
    ("https://100.100.100.200/", False, False),  # Alibaba metadata
    ("https://[fe80::1]/", False, False),
    ("https://0.0.0.0/", False, False),
    ("https://[::]/", False, False),
    ("https://224.0.0.1/", False, False),
    ("https://240.0.0.1/", False, False),
    ("https://255.255.255.255/", False, False),
    ("https://user:pw@8.8.8.8/", False, False),  # credentials in a URL end up in logs
    ("ftp://8.8.8.8/", False, False),
    ("file:///etc/passwd", False, False),
    ("https:///nohost", False, False),
]


@pytest.mark.parametrize(("url", "public", "private"), TABLE, ids=[t[0] for t in TABLE])
def test_the_guard_allows_only_public_https_unless_the_operator_allows_private(url, public, private):
    for allow, expected in ((False, public), (True, private)):
        if expected:
            assert outbound_check(url, allow_private=allow).addresses
        else:
            with pytest.raises(OutboundRefused):
                outbound_check(url, allow_private=allow)


def test_a_name_is_refused_when_any_of_its_addresses_is_internal(monkeypatch):
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["8.8.8.8", "10.1.2.3"])
    with pytest.raises(OutboundRefused, match="hooks.example.test resolves to 10.1.2.3"):
        outbound_check("https://hooks.example.test/x")
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["8.8.8.8", "2001:4860:4860::8888"])
    target = outbound_check("https://hooks.example.test/x?a=1")
    assert (target.host, target.port, target.path) == ("hooks.example.test", 443, "/x?a=1")


def test_a_name_that_does_not_resolve_is_an_error_not_a_pass(monkeypatch):
    def fail(host, port):
        raise OSError("Name or service not known")

    monkeypatch.setattr(outbound, "resolve", fail)
    with pytest.raises(OutboundError):
        outbound_check("https://nowhere.example.test/")


@pytest.fixture
def server() -> Iterator[tuple[str, int, list[tuple[str, str, dict]]]]:
    """A real HTTP server on 127.0.0.1: /redirect answers 302 to /target, the rest 204."""
    got: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append(("POST", self.path, dict(self.headers)))
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/target")
                self.end_headers()
            else:
                self.send_response(204)
                self.end_headers()

        do_GET = do_POST

        def log_message(self, *args):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", srv.server_port, got
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_the_post_connects_to_the_checked_address_and_sends_the_original_host(server, monkeypatch):
    host, port, got = server
    calls = []

    def fake_dns(name, p):
        calls.append(name)
        return [host]

    # hooks.example.test exists only in this stand-in resolver: the request can arrive only if
    # the connection is made to the address the guard checked, not looked up again.
    monkeypatch.setattr(outbound, "resolve", fake_dns)
    resp = outbound_post(f"http://hooks.example.test:{port}/in?x=1", body=b"{}", headers={}, timeout_s=5,
                         allow_private=True)
    assert resp.status == 204
    assert calls == ["hooks.example.test"]
    (method, path, headers), = got
    assert (method, path, headers["Host"]) == ("POST", "/in?x=1", f"hooks.example.test:{port}")


def test_a_redirect_is_not_followed(server):
    host, port, got = server
    resp = outbound_post(f"http://{host}:{port}/redirect", body=b"{}", headers={}, timeout_s=5, allow_private=True)
    assert resp.status == 302
    assert [p for _, p, _ in got] == ["/redirect"]  # /target never asked


def test_a_refused_url_is_never_connected_to(server):
    host, port, got = server
    with pytest.raises(OutboundRefused):
        outbound_post(f"http://{host}:{port}/in", body=b"{}", headers={}, timeout_s=5, allow_private=False)
    assert got == []


@pytest.fixture
def tls_server(tmp_path) -> Iterator[tuple[int, Path, list[str]]]:
    """A real TLS server on 127.0.0.1 with a self-signed certificate for hooks.example.test only."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=hooks.example.test", "-addext", "subjectAltName=DNS:hooks.example.test",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    names: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    srv = HTTPServer(("127.0.0.1", 0), Handler)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_port, cert, names
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def test_https_verifies_the_certificate_for_the_name_and_sends_it_as_sni(tls_server, monkeypatch):
    port, cert, names = tls_server
    monkeypatch.setattr(outbound, "resolve", lambda host, p: ["127.0.0.1"])
    # not trusted: refused by TLS, nothing delivered
    with pytest.raises(OutboundError, match="CERTIFICATE_VERIFY_FAILED"):
        outbound_post(f"https://hooks.example.test:{port}/", body=b"{}", headers={}, timeout_s=5,
                      allow_private=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted, as a real CA's certificate would be
    resp = outbound_post(f"https://hooks.example.test:{port}/", body=b"{}", headers={}, timeout_s=5,
                         allow_private=True)
    assert resp.status == 204 and names[-1] == "hooks.example.test"
    # a certificate for another name does not do for this one
    with pytest.raises(OutboundError, match="CERTIFICATE_VERIFY_FAILED"):
        outbound_post(f"https://other.example.test:{port}/", body=b"{}", headers={}, timeout_s=5,
                      allow_private=True)
