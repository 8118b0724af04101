#!/usr/bin/env python3
"""A TLS-terminating proxy in front of PostgreSQL, for the tests.

It answers libpq's SSLRequest itself, speaks TLS to the client and plain TCP
to the server, the way a TLS-terminating load balancer or pooler does. Unlike
PostgreSQL, which writes at most 8 KiB at a time, it sends what the server
sent in TLS records of the largest size (16 KiB), and makes the last record
of every burst a full one. Records that large are legal, and they leave part
of a record inside the client's OpenSSL after libpq has read what fits in its
buffer: bytes a poll of the socket never reports. A client that waits on the
socket without asking OpenSSL first then waits for bytes that will not come.

Usage: proxy.py --cert C --key K --upstream-port P --port-file F
Prints nothing; writes the port it listens on to F once it listens.
"""

import argparse
import asyncio
import os
import ssl
import struct

SSL_REQUEST = struct.pack("!II", 8, 80877103)
GSSENC_REQUEST = struct.pack("!II", 8, 80877104)
RECORD = 16384


async def relay_client_to_server(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def relay_server_to_client(reader, writer):
    try:
        while data := await reader.read(65536):
            burst = bytearray(data)
            # What else the server sends within a few milliseconds goes in
            # the same burst.
            while len(burst) < 4 * RECORD:
                try:
                    more = await asyncio.wait_for(reader.read(65536), 0.005)
                except asyncio.TimeoutError:
                    break
                if not more:
                    break
                burst += more
            # One SSL_write per piece: the pieces before are records of
            # whatever size; the last is one full record when the burst
            # allows it.
            head = len(burst) - RECORD if len(burst) > RECORD else 0
            if head:
                writer.write(bytes(burst[:head]))
            writer.write(bytes(burst[head:]))
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def handle(client_reader, client_writer, args, context):
    try:
        first = await client_reader.readexactly(8)
        while first == GSSENC_REQUEST:
            client_writer.write(b"N")
            first = await client_reader.readexactly(8)
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", args.upstream_port)
        if first == SSL_REQUEST:
            client_writer.write(b"S")
            await client_writer.drain()
            await client_writer.start_tls(context)
        else:
            server_writer.write(first)  # a client without TLS: passed as it is
        await asyncio.gather(
            relay_client_to_server(client_reader, server_writer),
            relay_server_to_client(server_reader, client_writer),
        )
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        client_writer.close()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    server = await asyncio.start_server(lambda r, w: handle(r, w, args, context), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.rename(tmp, args.port_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
