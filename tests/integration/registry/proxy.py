#!/usr/bin/env python3
"""A TLS front for the test registry that asks for credentials, as a
production schema registry does: HTTPS with the given certificate, and
every request refused with 401 unless it carries the expected basic
credentials or bearer token. What passes is forwarded to the upstream
registry as it is.

  proxy.py --upstream http://127.0.0.1:PORT --cert C.pem --key K.pem \
           (--basic user:password | --bearer TOKEN) --port-file F

Listens on 127.0.0.1 and a free port, written to --port-file once it listens.
"""
import argparse
import base64
import http.server
import ssl
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--basic", default="")
    ap.add_argument("--bearer", default="")
    ap.add_argument("--port-file", required=True)
    args = ap.parse_args()
    expected = ("Basic " + base64.b64encode(args.basic.encode()).decode()) if args.basic else f"Bearer {args.bearer}"

    class Handler(http.server.BaseHTTPRequestHandler):
        def forward(self):
            if self.headers.get("Authorization") != expected:
                body = b'{"error_code": 401, "message": "Unauthorized"}'
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else None
            req = urllib.request.Request(args.upstream + self.path, data=data, method=self.command)
            for h in ("Content-Type", "Accept"):
                if self.headers.get(h):
                    req.add_header(h, self.headers[h])
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, body, ctype = r.status, r.read(), r.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as e:
                status, body, ctype = e.code, e.read(), e.headers.get("Content-Type", "application/json")
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = forward
        do_POST = forward

        def log_message(self, fmt, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
