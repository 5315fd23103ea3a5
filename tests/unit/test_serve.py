"""The book's local server (posttrainllm.tools.serve) against careless and hostile requests."""

import socket
import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrainllm.tools.serve import ISOLATION_HEADERS, make_server


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text("<p>book</p>")
    (root / "lite").mkdir()
    (root / "lite" / "index.html").write_text("<p>lite</p>")
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text("not part of the book")
    (root / "leak.txt").symlink_to(secret)
    (root / "leakdir").symlink_to(secret.parent, target_is_directory=True)
    (root / "inside.html").symlink_to(root / "index.html")
    server = make_server(root, port=0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


def raw(port, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_pages_are_served_isolated_and_the_lite_site_is_not(site):
    status, body, headers = get(site, "/index.html")
    assert status == 200 and body == b"<p>book</p>"
    assert all(headers[k] == v for k, v in ISOLATION_HEADERS.items())
    status, _, headers = get(site, "/lite/index.html")
    assert status == 200 and "Cross-Origin-Embedder-Policy" not in headers


def test_a_symlink_out_of_the_root_is_not_followed(site):
    assert get(site, "/leak.txt")[0] == 404
    assert get(site, "/leakdir/secret.txt")[0] == 404
    assert get(site, "/inside.html")[:2] == (200, b"<p>book</p>")  # one that stays inside is fine


@pytest.mark.parametrize(("request_line", "status"), [
    (b"GARBAGE\r\n\r\n", b"400"),
    (b"GET / HTTP/9.9\r\n\r\n", b"505"),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"414"),
])
def test_a_malformed_request_line_gets_its_status_not_a_crash(site, request_line, status):
    answer = raw(site, request_line)
    # http.server answers a request it could not parse as HTTP/0.9 does: the error page, no status line
    assert b"Error code: " + status in answer, answer[:200]
    assert get(site, "/index.html")[0] == 200  # and the server goes on serving


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_get_an_http_answer(site, data):
    answer = raw(site, data + b"\r\n\r\n")
    assert answer == b"" or answer.startswith(b"HTTP/") or b"Error code: " in answer, answer[:200]


@pytest.mark.parametrize("path", ["/index%00.html", "/%ed%a0%80", "/lite/%00"])
def test_a_nul_byte_or_a_lone_surrogate_gets_400_not_a_traceback(site, path, capfd):
    assert get(site, path)[0] == 400
    assert get(site, "/index.html")[0] == 200
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("path", ["/lite/../index.html", "/lite/%2e%2e/index.html", "/lite/./../index.html"])
def test_the_isolation_headers_follow_the_file_not_the_spelling_of_its_path(site, path):
    status, body, headers = get(site, path)
    assert status == 200 and body == b"<p>book</p>"
    assert all(headers[k] == v for k, v in ISOLATION_HEADERS.items())


def test_a_client_that_hangs_up_mid_request_leaves_no_traceback(site, capfd):
    import struct

    for _ in range(3):
        conn = socket.create_connection(("127.0.0.1", site), timeout=10)
        conn.sendall(b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        conn.close()
    assert get(site, "/index.html")[0] == 200
    assert "Traceback" not in capfd.readouterr().err
