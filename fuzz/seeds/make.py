#!/usr/bin/env python3
"""Write the seed inputs of the fuzz targets (fuzz/seeds/<target>/). Run it from anywhere;
the seeds it writes are committed. Each seed is a small, valid (or deliberately hostile)
input of the target's format, for libFuzzer to start from."""
import gzip, hashlib, io, json, os, tarfile

here = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(here, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def tar(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, kind, arg, pax) with kind file/dir/sym/link/chr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, arg, *pax in entries:
            i = tarfile.TarInfo(name)
            i.mtime = 1
            i.mode = 0o644
            data = None
            if kind == "file":
                data = arg
                i.size = len(arg)
            elif kind == "dir":
                i.type, i.mode = tarfile.DIRTYPE, 0o755
            elif kind == "sym":
                i.type, i.linkname = tarfile.SYMTYPE, arg
            elif kind == "link":
                i.type, i.linkname = tarfile.LNKTYPE, arg
            elif kind == "chr":
                i.type, i.devmajor, i.devminor = tarfile.CHRTYPE, arg[0], arg[1]
            if pax:
                i.pax_headers = pax[0]
            t.addfile(i, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    # Drop the record padding after the end-of-archive blocks: seeds stay small.
    end = len(raw.rstrip(b"\0"))
    end = -(-end // 512) * 512
    return raw[: end + 1024]


layer = tar([
    ("etc", "dir", None),
    ("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n"),
    ("bin/busybox", "file", b"\x7fELF"),
    ("bin/sh", "sym", "busybox"),
    ("bin/ash", "link", "bin/busybox"),
    ("etc/localtime", "sym", "/usr/share/zoneinfo/UTC"),
    ("var/.wh.cache", "file", b""),
    ("opt/.wh..wh..opq", "file", b""),
    ("dev/null", "chr", (1, 3)),
])
put("image_layer", "basic", b"\0" + layer)
put("image_layer", "basic-gz", b"\1" + layer)
put("image_layer", "blob-gz", b"\2" + gzip.compress(layer, mtime=0))
put("image_layer", "pax-xattr", b"\0" + tar([
    ("usr/bin/ping", "file", b"x", {"SCHILY.xattr.user.note": "kept", "uid": "1000"}),
    ("a" * 120 + "/long", "file", b"long name"),
], fmt=tarfile.PAX_FORMAT))
# The attack of issue 11: a symlink out of the layer, then entries through it.
put("image_layer", "escape", b"\0" + tar([
    ("a", "sym", "../victim"),
    ("a/wdir/.wh.victim", "file", b""),
    ("a/odir/.wh..wh..opq", "file", b""),
    ("a/ddir/null", "chr", (1, 3)),
    ("h", "link", "a/x"),
]))


def sha(b):
    return hashlib.sha256(b).hexdigest()


# image_archive: documents separated by \n--\n, @@N = sha256 of document N, @@sN = its size.
small = tar([("hello", "file", b"hi\n"), ("bin", "dir", None)])
oci_manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:@@2", "size": 0},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:@@3", "size": "@@s3"}],
}).replace('"@@s3"', "@@s3").encode()
config = json.dumps({
    "architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"], "User": "0"},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:@@3"]},
}).encode()
index = json.dumps({
    "schemaVersion": 2,
    "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:@@1",
                   "size": "@@s1", "annotations": {"io.containerd.image.name": "localhost/fuzz:1"}}],
}).replace('"@@s1"', "@@s1").encode()
sep = b"\n--\n"
oci = sep.join([index, oci_manifest, config, small])
put("image_archive", "oci-dir", b"\0" + oci)
put("image_archive", "oci-tar-gz", b"\6" + oci)
nested = json.dumps({
    "schemaVersion": 2,
    "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": "sha256:@@1",
                   "size": 1, "annotations": {"org.opencontainers.image.ref.name": "x/y:z"}}],
}).encode()
inner = json.dumps({
    "schemaVersion": 2,
    "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:@@2",
                   "size": 1, "platform": {"os": "linux", "architecture": "amd64"}}],
}).encode()
manifest2 = oci_manifest.replace(b"@@3", b"@@4").replace(b"@@s3", b"@@s4").replace(b"@@2", b"@@3")
config2 = config.replace(b"@@3", b"@@4")
put("image_archive", "oci-nested-index", b"\2" + sep.join([nested, inner, manifest2, config2, small]))
docker = json.dumps([{"Config": "1.json", "RepoTags": ["localhost/fuzz-docker:1"], "Layers": ["2.tar"]}]).encode()
dconfig = config.replace(b"@@3", b"@@2")
put("image_archive", "docker-tar", b"\3" + sep.join([docker, dconfig, small]))

# crilog_records: CRI log lines, partial pieces, both streams, old untagged lines, garbage.
put("crilog_records", "lines", b"".join([
    b"2023-11-14T22:13:20.12Z stdout F hello world\n",
    b"2023-11-14T22:13:20.2Z stderr P par\n",
    b"2023-11-14T22:13:20.3Z stdout P interleaved \n",
    b"2023-11-14T22:13:20.4Z stderr F tial\n",
    b"2023-11-14T22:13:20.5Z stdout F done\n",
    b"2023-11-14T22:13:21Z stdout untagged old line\n",
    b"garbage\n\n",
    b"2023-11-14T22:13:22Z stderr P unfinished",
]))

# crilog_writer: chunk, repeat, size, files bytes, then the container's output.
put("crilog_writer", "lines", bytes([3, 0, 1, 1]) + b"one\ntwo\n\nthree without newline")
put("crilog_writer", "long", bytes([200, 30, 40, 2]) + b"x" * 700 + b"\n" + b"y" * 100)

# spdy_frames: what kubectl sends on an exec and a port-forward connection, header blocks
# compressed with the SPDY/3 dictionary in one zlib stream (as src/server/streaming/spdy.rs).
import struct, zlib
SPDY_WORDS = ["options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
              "accept-encoding", "accept-language", "accept-ranges", "age", "allow", "authorization",
              "cache-control", "connection", "content-base", "content-encoding", "content-language",
              "content-length", "content-location", "content-md5", "content-range", "content-type",
              "date", "etag", "expect", "expires", "from", "host", "if-match", "if-modified-since",
              "if-none-match", "if-range", "if-unmodified-since", "last-modified", "location",
              "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization", "range", "referer",
              "retry-after", "server", "te", "trailer", "transfer-encoding", "upgrade", "user-agent",
              "vary", "via", "warning", "www-authenticate", "method", "get", "status", "200 OK",
              "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
SPDY_TAIL = ("100101201202205206300302303304305306307402405406407408409410411412413414415416417"
             "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
             "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error"
             "501 Not Implemented503 Service Unavailable"
             "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
             "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
             "chunked,text/html,image/png,image/jpg,image/gif,application/xml,"
             "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
             "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
SPDY_DICT = b"".join(struct.pack(">I", len(w)) + w.encode() for w in SPDY_WORDS) + SPDY_TAIL.encode()
assert len(SPDY_DICT) == 1423


def spdy_session(frames):
    z = zlib.compressobj(zdict=SPDY_DICT)
    out = b""
    for kind, flags, payload in frames:
        if kind == "data":
            sid, data = payload
            out += struct.pack(">I", sid) + bytes([flags]) + struct.pack(">I", len(data))[1:] + data
            continue
        if isinstance(payload, tuple):
            prefix, headers = payload
            block = struct.pack(">I", len(headers))
            for n, v in headers:
                block += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
            payload = prefix + z.compress(block) + z.flush(zlib.Z_SYNC_FLUSH)
        out += struct.pack(">HHB", 0x8003, kind, flags) + struct.pack(">I", len(payload))[1:] + payload
    return out


def syn(sid, headers):
    return (1, 0, (struct.pack(">II", sid, 0) + b"\0\0", headers))


put("spdy_frames", "exec", spdy_session([
    syn(1, [(b"streamtype", b"error")]),
    syn(3, [(b"streamtype", b"stdin")]),
    syn(5, [(b"streamtype", b"stdout")]),
    (4, 0, struct.pack(">I", 1) + struct.pack(">II", 7, 65536)),
    (6, 0, struct.pack(">I", 1)),
    ("data", 1, (3, b"hi\n")),
    (9, 0, struct.pack(">II", 5, 65536)),
    (8, 0, (struct.pack(">I", 5), [(b"a", b"b\0c")])),
    (7, 0, struct.pack(">II", 5, 0)),
]))
put("spdy_frames", "portforward", spdy_session([
    syn(1, [(b"streamtype", b"error"), (b"port", b"8080"), (b"requestid", b"0")]),
    syn(3, [(b"streamtype", b"data"), (b"port", b"8080"), (b"requestid", b"0")]),
    ("data", 0, (3, b"GET / HTTP/1.1\r\n\r\n")),
    (3, 0, struct.pack(">II", 3, 5)),
]))


# registry_manifest: [content type, platform, log2 layer limit] + body (see the target).
def digest(tag):
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


def plat(os_, arch, variant=None):
    p = {"os": os_, "architecture": arch}
    if variant:
        p["variant"] = variant
    return p


index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest("amd64"), "size": 500,
     "platform": plat("linux", "amd64")},
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest("arm64"), "size": 500,
     "platform": plat("linux", "arm64", "v8")},
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest("armv6"), "size": 500,
     "platform": plat("linux", "arm", "v6")},
    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest("attestation"), "size": 300,
     "platform": plat("unknown", "unknown")},
]}).encode()
put("registry_manifest", "oci-index", bytes([0, 0, 34]) + index)
put("registry_manifest", "docker-list-arm", bytes([2, 2, 34]) + index.replace(b"oci.image.index.v1", b"docker.distribution.manifest.list.v2"))
foreign = json.dumps({"schemaVersion": 2, "manifests": [
    {"digest": digest("p%d" % i), "size": 10, "platform": plat("windows", "arch%d" % i)} for i in range(40)]}).encode()
put("registry_manifest", "index-no-match", bytes([5, 1, 34]) + foreign)
image = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
         "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest("config"), "size": 600},
         "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest("l1"), "size": 1031818},
                    {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": digest("l2"), "size": 2 ** 62}]}
put("registry_manifest", "oci-manifest-huge-layer", bytes([1, 0, 34]) + json.dumps(image).encode())
image["mediaType"] = "application/vnd.docker.distribution.manifest.v2+json"
image["config"]["mediaType"] = "application/vnd.docker.container.image.v1+json"
image["layers"] = image["layers"][:1]
image["layers"][0]["mediaType"] = "application/vnd.docker.image.rootfs.diff.tar.gzip"
put("registry_manifest", "docker-manifest", bytes([3, 0, 34]) + json.dumps(image).encode())
put("registry_manifest", "schema1", bytes([4, 0, 34]) + json.dumps(
    {"schemaVersion": 1, "name": "library/busybox", "tag": "1.35", "fsLayers": [{"blobSum": digest("l1")}]}).encode())

# spdy_session: the same sessions driven through the agent's connection, and a client that
# opens more streams than an exec connection allows, then sends data on one and pings.
put("spdy_session", "exec", spdy_session([
    syn(1, [(b"streamtype", b"error")]),
    syn(3, [(b"streamtype", b"stdin")]),
    syn(5, [(b"streamtype", b"stdout")]),
    ("data", 0, (3, b"hi\n")),
    ("data", 1, (3, b"")),
    (3, 0, struct.pack(">II", 5, 5)),
]))
put("spdy_session", "flood", spdy_session(
    [syn(2 * i + 1, [(b"streamtype", b"stdin")]) for i in range(12)]
    + [("data", 0, (1, b"x" * 1024)) for _ in range(4)]
    + [(6, 0, struct.pack(">I", 7))]
))

# websocket_frames: the first byte picks the channel framing (bit 0 base64, bit 1 v5's CLOSE
# signal), the rest is what a client sends: masked frames.
def ws_frame(opcode, payload, fin=True, mask=b"\x01\x02\x03\x04"):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


put("websocket_frames", "binary", bytes([2]) + ws_frame(2, b"\x00hello") + ws_frame(2, b"\xff\x00")
    + ws_frame(9, b"ping") + ws_frame(8, struct.pack(">H", 1000)))
put("websocket_frames", "base64", bytes([1]) + ws_frame(1, b"0aGVsbG8=") + ws_frame(1, b"4eyJXaWR0aCI6ODB9"))
put("websocket_frames", "fragments", bytes([0]) + ws_frame(2, b"\x00ab", fin=False)
    + ws_frame(0, b"cd", fin=False) + ws_frame(0, b"ef"))
put("websocket_frames", "too_large", bytes([0]) + ws_frame(2, b"\x00" + b"y" * 300000)[:2 + 8 + 4 + 100])
