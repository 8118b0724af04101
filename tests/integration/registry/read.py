#!/usr/bin/env python3
"""An independent reader of schema-registry records (Confluent wire format:
a 0 byte, the schema id as 4 big-endian bytes, for Protobuf the message
indexes, then the encoded value). It decodes with confluent-kafka's own
deserializers (AvroDeserializer, JSONDeserializer, ProtobufDeserializer)
against a registry's Confluent-compatible API, e.g. Apicurio's
http://HOST:PORT/apis/ccompat/v7, and prints one JSON object a line:

  {"topic", "partition", "offset", "key", "value", "schema_id", "headers"}

key is the key as UTF-8 text (or decoded with --key-format), value the
decoded value (null for a tombstone), schema_id the int in bytes 1..4 of the
value, headers name -> UTF-8 text (a list when a name repeats). In value:
Avro bytes/fixed are base64 text, decimals text, dates and times ISO 8601;
Protobuf follows the proto3 JSON mapping (field names as in the .proto,
int64 as text, fields at their default value included).

Exits 1 when fewer than --count records arrive within --timeout, 2 when a
record cannot be decoded (after printing the records before it), 3 on a bad
argument or setup. Needs the venv of scripts/py-venv.sh.

Protobuf: ProtobufDeserializer decodes into a message class its caller
gives. This reader fetches the writer's schema by the record's schema id
(GET /schemas/ids/{id}, references by subject and version); .proto text it
compiles with protoc (grpc_tools.protoc) into a descriptor set, a base64
FileDescriptorProto (what confluent-kafka's ProtobufSerializer registers)
it takes as it is. It loads them into a descriptor pool of its own (a
generated _pb2 module would go into the process-wide pool, where two
versions of one schema clash) and picks the message the record's message
indexes name. The deserializer also asks the registry for the schema with
?format=serialized, which Confluent answers with a base64
FileDescriptorProto. Apicurio 3.3.3 does not: for .proto text it puts the
descriptor's raw bytes into the JSON string (non-ASCII bytes lost, imports
renamed after their package), for a schema stored as base64 it fails with
500. Where the answer is not such a base64 descriptor, the reader's client
answers with the descriptor it made itself.

  read.py --bootstrap HOST:PORT --registry URL --topic T --format avro|json|protobuf
          --count N [--timeout S] [--from-beginning] [--raw] [--key-format string|avro|json|protobuf]
"""
import argparse
import base64
import datetime
import decimal
import importlib
import importlib.resources
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import urllib.parse
import uuid

import attrs
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.schema_registry import RegisteredSchema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_tools import protoc


class Undecodable(Exception):
    pass


def die(code, msg):
    print(f"read.py: {msg}", file=sys.stderr)
    sys.exit(code)


def schema_id_of(data):
    """The schema id of Confluent framing, or None when data is not framed."""
    if data is None or len(data) < 5 or data[0] != 0:
        return None
    return struct.unpack(">I", data[1:5])[0]


def read_varint(data, pos):
    """A zigzag varint (the message index encoding) at pos; (value, next pos)."""
    shift = result = 0
    while True:
        if pos >= len(data):
            raise Undecodable("truncated message indexes")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (result >> 1) ^ -(result & 1), pos


def message_indexes(data):
    """The message indexes after the schema id: [0] (the first message) when
    the record gives none, as the wire format shortens that case to one 0."""
    count, pos = read_varint(data, 5)
    if count == 0:
        return [0]
    if count < 0 or count > 100:
        raise Undecodable(f"implausible message index count {count}")
    out = []
    for _ in range(count):
        i, pos = read_varint(data, pos)
        out.append(i)
    return out


def is_base64(s):
    try:
        base64.b64decode(s or "", validate=True)
        return bool(s)
    except Exception:
        return False


def binary_descriptor(schema_str):
    """The FileDescriptorProto a schema's text is the base64 of (what
    confluent-kafka's ProtobufSerializer registers), else None (.proto text)."""
    if not is_base64(schema_str):
        return None
    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema_str))
    except Exception:
        return None
    return fdp if fdp.message_type or fdp.enum_type else None


def add_well_known(pool, name, added):
    """google/protobuf/X.proto into pool, as this protobuf runtime has it."""
    if name in added:
        return
    module = "google.protobuf." + name[len("google/protobuf/"):-len(".proto")].replace("/", ".") + "_pb2"
    try:
        importlib.import_module(module)
        fd = descriptor_pool.Default().FindFileByName(name)
    except Exception:
        raise Undecodable(f"no well-known type {name} in this protobuf runtime")
    for dep in fd.dependencies:
        add_well_known(pool, dep.name, added)
    pool.AddSerializedFile(fd.serialized_pb)
    added.add(name)


class Protos:
    """The registry's Protobuf schemas as descriptors: .proto text compiled
    with protoc (grpc_tools.protoc), base64 descriptors as they are;
    references fetched by subject and version. Not through the client's
    cache, which keys by id and subject only, not by ?format."""

    def __init__(self, client):
        self.client = client
        self.work = tempfile.mkdtemp(prefix="walrelay-read-proto-")
        self.wkt = str(importlib.resources.files("grpc_tools") / "_proto")
        self.by_key = {}

    def _plain_id(self, sid):
        return RegisteredSchema.from_dict(self.client._rest_client.get(f"schemas/ids/{sid}")).schema

    def _plain_version(self, subject, version):
        return RegisteredSchema.from_dict(self.client._rest_client.get(
            f"subjects/{urllib.parse.quote(subject, safe='')}/versions/{version}")).schema

    def by_id(self, sid):
        return self._compile(self._plain_id(sid), f"id{sid}.proto")

    def by_version(self, subject, version):
        return self._compile(self._plain_version(subject, version), None)

    def _files(self, schema, name, out, seen):
        """Appends to out the FileDescriptorProtos of schema (named name) and
        of its references, dependencies first."""
        fdp = binary_descriptor(schema.schema_str)
        if fdp is None:
            root = tempfile.mkdtemp(dir=self.work)
            self._write(root, name, schema, set())
            dset = os.path.join(root, ".set.pb")
            rc = protoc.main(["protoc", f"-I{root}", f"-I{self.wkt}", "--include_imports",
                              f"--descriptor_set_out={dset}", name])
            if rc != 0:
                raise Undecodable(f"protoc could not compile {name} (errors above):\n{schema.schema_str}")
            with open(dset, "rb") as f:
                files = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
            for f in files:
                if f.name not in seen:
                    seen.add(f.name)
                    out.append(f)
            return
        fdp.name = name
        for ref in schema.references or []:
            if ref.name not in seen and not ref.name.startswith("google/protobuf/"):
                seen.add(ref.name)
                self._files(self._plain_version(ref.subject, ref.version), ref.name, out, seen)
        out.append(fdp)

    def _write(self, root, name, schema, seen):
        """.proto text and its references' under root, for protoc."""
        if binary_descriptor(schema.schema_str) is not None:
            raise Undecodable(f"{name} is a binary descriptor referenced from .proto text: not supported")
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(schema.schema_str or "")
        for ref in schema.references or []:
            if ref.name not in seen and not ref.name.startswith("google/protobuf/"):
                seen.add(ref.name)
                self._write(root, ref.name, self._plain_version(ref.subject, ref.version), seen)

    def _compile(self, schema, name):
        """(main FileDescriptorProto, FileDescriptor in a pool of its own)."""
        key = (schema.schema_str, tuple((r.name, r.subject, r.version) for r in schema.references or []))
        if key not in self.by_key:
            files = []
            self._files(schema, name or "schema.proto", files, set())
            pool, added = descriptor_pool.DescriptorPool(), set()
            for f in files:
                for dep in f.dependency:
                    if dep.startswith("google/protobuf/"):
                        add_well_known(pool, dep, added)
                if f.name.startswith("google/protobuf/"):
                    add_well_known(pool, f.name, added)
                else:
                    pool.Add(f)
            main = files[-1]
            self.by_key[key] = (main, pool.FindFileByName(main.name))
        return self.by_key[key]


class RegistryClient(SchemaRegistryClient):
    """confluent-kafka's client, but where a Protobuf schema's
    ?format=serialized answer is not the base64 of a FileDescriptorProto
    (Apicurio 3.3.3 puts the descriptor's raw bytes into the JSON string for
    .proto text, and fails with 500 for a schema stored as base64), the
    answer is the base64 of the descriptor this reader makes (protos)."""

    def __init__(self, conf):
        super().__init__(conf)
        self.protos = Protos(self)
        self.serialized = {}

    def get_schema(self, schema_id, subject_name=None, fmt=None, reference_format=None):
        if fmt != "serialized":
            return super().get_schema(schema_id, subject_name, fmt, reference_format)
        key = ("id", schema_id)
        if key not in self.serialized:
            try:
                schema = super().get_schema(schema_id, subject_name, fmt, reference_format)
                if schema.schema_type != "PROTOBUF" or binary_descriptor(schema.schema_str) is not None:
                    return schema
            except SchemaRegistryError as e:
                if e.http_status_code == 404:
                    raise
            plain = self.protos._plain_id(schema_id)
            main, _ = self.protos.by_id(schema_id)
            self.serialized[key] = attrs.evolve(
                plain, schema_str=base64.b64encode(main.SerializeToString()).decode())
        return self.serialized[key]

    def get_version(self, subject_name, version="latest", deleted=False, fmt=None):
        if fmt != "serialized":
            return super().get_version(subject_name, version, deleted, fmt)
        key = ("version", subject_name, version)
        if key not in self.serialized:
            try:
                reg = super().get_version(subject_name, version, deleted, fmt)
                if reg.schema.schema_type != "PROTOBUF" or binary_descriptor(reg.schema.schema_str) is not None:
                    return reg
            except SchemaRegistryError as e:
                if e.http_status_code == 404:
                    raise
            reg = RegisteredSchema.from_dict(self._rest_client.get(
                f"subjects/{urllib.parse.quote(subject_name, safe='')}/versions/{version}"))
            main, _ = self.protos.by_version(subject_name, version)
            self.serialized[key] = attrs.evolve(reg, schema=attrs.evolve(
                reg.schema, schema_str=base64.b64encode(main.SerializeToString()).decode()))
        return self.serialized[key]


class Decoder:
    """One format's deserializer(s) over one registry client."""

    def __init__(self, fmt, client):
        self.fmt, self.client, self.protos = fmt, client, client.protos
        # The topic's subject for what needs one (rules, use.latest.version:
        # neither used here): TOPIC spares the default ASSOCIATED strategy's
        # lookup of Confluent's /associations, which Apicurio does not have.
        self.conf = {"subject.name.strategy.type": "TOPIC"}
        self.protobuf = {}  # (schema id, message indexes) -> ProtobufDeserializer
        if fmt == "avro":
            self.des = AvroDeserializer(client, conf=self.conf)
        elif fmt == "json":
            self.des = JSONDeserializer(None, schema_registry_client=client, conf=self.conf)

    def __call__(self, data, ctx):
        if data is None:
            return None
        sid = schema_id_of(data)
        if sid is None:
            raise Undecodable(f"not in the Confluent wire format (first bytes {data[:8].hex()})")
        kind = self.client.get_schema(sid).schema_type or "AVRO"
        if kind != self.fmt.upper():
            raise Undecodable(f"schema {sid} is {kind}, not {self.fmt.upper()}")
        if self.fmt == "protobuf":
            value = self._protobuf(sid, data)(data, ctx)
            return json_format.MessageToDict(value, preserving_proto_field_name=True,
                                             always_print_fields_with_no_presence=True)
        return self.des(data, ctx)

    def _protobuf(self, sid, data):
        idx = tuple(message_indexes(data))
        des = self.protobuf.get((sid, idx))
        if des is None:
            _, fd = self.protos.by_id(sid)
            # The indexes name a top-level message, then nested ones, in
            # the order of the .proto.
            desc = None
            for i in idx:
                seq = proto_messages(fd) if desc is None else desc.nested_types
                if i < 0 or i >= len(seq):
                    raise Undecodable(f"message index {list(idx)} out of range in schema {sid}")
                desc = seq[i]
            cls = message_factory.GetMessageClass(desc)
            des = ProtobufDeserializer(cls, dict(self.conf, **{"use.deprecated.format": False}),
                                       schema_registry_client=self.client)
            self.protobuf[(sid, idx)] = des
        return des


def proto_messages(fd):
    """A file's top-level messages in declaration order."""
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    prefix = f"{proto.package}." if proto.package else ""
    return [fd.pool.FindMessageTypeByName(prefix + m.name) for m in proto.message_type]


def jsonable(v):
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


def text(b, what):
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise Undecodable(f"{what} is not UTF-8 ({b[:16].hex()}...)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, HOST:PORT")
    ap.add_argument("--registry", help="base URL of the Confluent-compatible API "
                    "(Apicurio: http://HOST:PORT/apis/ccompat/v7); not needed with --raw")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--format", choices=["avro", "json", "protobuf"], help="the values' format")
    ap.add_argument("--key-format", choices=["string", "avro", "json", "protobuf"], default="string",
                    help="the keys' format (default: UTF-8 text)")
    ap.add_argument("--count", type=int, required=True, help="records to read, then exit")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for them (default 30)")
    ap.add_argument("--from-beginning", action="store_true",
                    help="from the partitions' start; else from their end when the reader starts")
    ap.add_argument("--raw", action="store_true", help="print the value bytes as base64, not decoded")
    args = ap.parse_args()
    if not args.raw and not args.format:
        die(3, "--format is required unless --raw")
    if not args.raw and not args.registry:
        die(3, "--registry is required unless --raw")
    if args.count < 0:
        die(3, "--count must be >= 0")

    client = None
    decode_value = decode_key = None
    if args.registry:
        client = RegistryClient({"url": args.registry.rstrip("/"), "timeout": 30})
        if not args.raw:
            decode_value = Decoder(args.format, client)
        if args.key_format != "string":
            decode_key = Decoder(args.key_format, client)
    elif args.key_format != "string":
        die(3, "--key-format other than string needs --registry")

    deadline = time.monotonic() + args.timeout
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"walrelay-read-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "isolation.level": "read_committed",
    })
    try:
        # The partitions, waiting for the topic (auto-created by a producer).
        partitions = None
        while partitions is None:
            try:
                md = consumer.list_topics(args.topic, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                t = md.topics.get(args.topic)
                if t is not None and t.error is None and t.partitions:
                    partitions = sorted(t.partitions)
                    break
            except KafkaException:
                pass
            if time.monotonic() >= deadline:
                die(1, f"got 0 of {args.count} records: topic {args.topic} does not exist after {args.timeout} s")
            time.sleep(0.2)
        # Explicit start offsets: "the end" is the end when the reader starts,
        # not when the first fetch happens to resolve it.
        # A topic just auto-created can be in the metadata before its
        # partitions have a leader: the broker then answers the offsets
        # query with an error, which is "not yet", until the deadline.
        assignment = []
        for p in partitions:
            while True:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(args.topic, p), timeout=max(1.0, min(5.0, deadline - time.monotonic())))
                    break
                except KafkaException as e:
                    if time.monotonic() >= deadline:
                        die(1, f"got 0 of {args.count} records: the offsets of {args.topic}[{p}]: {e}")
                    time.sleep(0.2)
            assignment.append(TopicPartition(args.topic, p, low if args.from_beginning else high))
        consumer.assign(assignment)

        got = 0
        while got < args.count:
            left = deadline - time.monotonic()
            if left <= 0:
                die(1, f"got {got} of {args.count} records from {args.topic} in {args.timeout} s")
            msg = consumer.poll(min(left, 1.0))
            if msg is None:
                continue
            if msg.error():
                if msg.error().fatal():
                    die(3, f"consumer: {msg.error()}")
                print(f"read.py: consumer: {msg.error()}", file=sys.stderr)
                continue
            where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
            raw = msg.value()
            headers = {}
            for name, v in msg.headers() or []:
                try:
                    v = text(v, f"header {name}")
                except Undecodable:
                    v = base64.b64encode(v).decode()
                if name in headers:
                    old = headers[name]
                    headers[name] = (old if isinstance(old, list) else [old]) + [v]
                else:
                    headers[name] = v
            try:
                if decode_key:
                    key = jsonable(decode_key(msg.key(), SerializationContext(
                        msg.topic(), MessageField.KEY, msg.headers())))
                else:
                    key = text(msg.key(), "the key")
                if args.raw:
                    value = None if raw is None else base64.b64encode(raw).decode()
                else:
                    value = jsonable(decode_value(raw, SerializationContext(
                        msg.topic(), MessageField.VALUE, msg.headers())))
            except Exception as e:  # the deserializers' errors, the registry's, protoc's
                print(json.dumps({"undecodable": where, "value_base64": None if raw is None
                                  else base64.b64encode(raw).decode()}), file=sys.stderr)
                die(2, f"cannot decode {where}: {type(e).__name__}: {e}")
            print(json.dumps({
                "topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                "key": key, "value": value, "schema_id": schema_id_of(raw), "headers": headers,
            }, ensure_ascii=False), flush=True)
            got += 1
    finally:
        consumer.close()
        if client is not None:
            shutil.rmtree(client.protos.work, ignore_errors=True)


if __name__ == "__main__":
    main()
