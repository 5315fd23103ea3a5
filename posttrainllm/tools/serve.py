"""Serve the built book on 127.0.0.1, the way the browser cells need it.

The headers make the page *cross-origin isolated* (``crossOriginIsolated === true``), which
WebAssembly threads need for ``SharedArrayBuffer``. ``make book`` and the browser tests both
use this server, so what the tests load is what a reader gets.

The browser editions' JupyterLite site and the page that embeds its REPL are served without
them (:data:`NOT_ISOLATED`): isolated, the Pyodide kernel of jupyterlite-pyodide-kernel 0.8.6
now and then never answers a cell (it switches to a SharedArrayBuffer channel), while without
isolation it runs through its own service worker, as on any static host.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import posixpath
import sys
import urllib.parse
from http import HTTPStatus
from pathlib import Path

ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}

NOT_ISOLATED = ("/lite/", "/book/in-your-browser.html")


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".wasm": "application/wasm",
        ".mjs": "text/javascript",
    }

    def end_headers(self) -> None:
        # a malformed request line is answered (400, 414, 505) before ``path`` is ever set; the
        # prefix is tested on the path as the file system will see it, so /lite/../x is /x
        if not _normalised(getattr(self, "path", "")).startswith(NOT_ISOLATED):
            for name, value in ISOLATION_HEADERS.items():
                self.send_header(name, value)
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def send_head(self):
        """Only files under the served folder: a symlink that leads out of it is not followed."""
        try:
            target = Path(self.translate_path(self.path)).resolve()
            target.stat()  # a NUL byte or a lone surrogate (%ed%a0%80) fails here, not in the base class
        except (FileNotFoundError, NotADirectoryError):
            target = None  # the base class answers 404
        except (ValueError, UnicodeError, OSError):
            self.send_error(HTTPStatus.BAD_REQUEST, "Bad path")
            return None
        root = Path(self.directory).resolve()
        if target is not None and target != root and root not in target.parents:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")  # the same answer as a missing file
            return None
        return super().send_head()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        if not getattr(self.server, "quiet", False):
            super().log_message(format, *args)


def _normalised(path: str) -> str:
    """The request's path without its query, decoded and with ``.`` and ``..`` resolved."""
    clean = posixpath.normpath(urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0]))
    return clean + "/" if path.split("?", 1)[0].endswith("/") and clean != "/" else clean


class _Server(http.server.ThreadingHTTPServer):
    quiet = False

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-request is an everyday event, worth one line, not a traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            if not self.quiet:
                print(f"{client_address[0]}: connection closed mid-request ({type(error).__name__})", file=sys.stderr)
            return
        super().handle_error(request, client_address)


def make_server(directory: Path, port: int = 0, quiet: bool = False) -> http.server.ThreadingHTTPServer:
    """A threaded static server for ``directory`` on 127.0.0.1 (port 0 picks a free port)."""
    if not (Path(directory) / "index.html").is_file():
        raise FileNotFoundError(f"no built book in {directory}: run `make book SERVE=0` first")
    handler = functools.partial(_Handler, directory=str(directory))
    server = _Server(("127.0.0.1", port), handler)
    server.quiet = quiet
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="serve the built book on 127.0.0.1")
    parser.add_argument("directory", nargs="?", default="_build/html", type=Path)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = make_server(args.directory, args.port)
    print(f"Serving the book at http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
