#!/usr/bin/env python3
"""Writes OCI image archives without a container engine or a registry (docs/development.md).

    hack/oci-image.py dockerfile --dockerfile Dockerfile --ref docker.io/library/module-manager:0.1.0 \
        --stage operator=DIR --stage helm=DIR --stage renderer=DIR --out image.tar [--plan]
        The image the Dockerfile's last stage describes. The Dockerfile is the one definition of
        the content: its FROM (the base), ARG, LABEL, COPY --from=<stage> (with --chown), USER,
        ENTRYPOINT and CMD are read from it; each builder stage is a directory given by --stage
        that holds what that stage's RUN produced (hack/build-image.sh fills them). An instruction
        this script does not know, a stage without a directory or a source missing from it is an
        error, so the image stage and the archive cannot drift apart silently (the builder stages'
        work is hack/build-image.sh's, pinned by tests/image.rs). --plan prints the
        image's files and configuration as JSON instead of writing the archive.
    hack/oci-image.py files --ref REF --out FILE --file SRC:DST[:MODE] ... --entrypoint JSON
        A one-layer image of the given files (testenv's pause image).

`ctr -n k8s.io images import FILE` imports the archive under REF (the annotation
io.containerd.image.name); the archive is byte-for-byte reproducible (entries sorted, times set to
SOURCE_DATE_EPOCH or 0, owners from the Dockerfile).
"""

import argparse
import datetime
import hashlib
import io
import json
import os
import re
import shlex
import sys
import tarfile

# The base image of the Dockerfile's last stage, and what of it the archive reproduces: the
# files of distroless/static-debian12:nonroot a static binary needs (the users, the CA bundle,
# a /tmp, the nonroot home). The CA bundle is Debian's (ca-certificates), as distroless's is.
BASES = {
    "gcr.io/distroless/static-debian12:nonroot": {
        "user": "65532",
        "workdir": "/home/nonroot",
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
    },
}
PASSWD = ("root:x:0:0:root:/root:/sbin/nologin\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
          "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
GROUP = "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def die(message):
    sys.exit(f"oci-image: {message}")


class Tree:
    """The image's file system: path -> (kind, data or link target, mode, uid, gid)."""

    def __init__(self):
        self.entries = {}

    def add_dir(self, path, mode=0o755, uid=0, gid=0):
        path = norm(path)
        if path == "/":
            return
        self.ensure_parent(path)
        self.entries[path] = ("dir", None, mode, uid, gid)

    def add_file(self, path, data, mode=0o644, uid=0, gid=0):
        path = norm(path)
        self.ensure_parent(path)
        self.entries[path] = ("file", data, mode, uid, gid)

    def add_link(self, path, target, uid=0, gid=0):
        path = norm(path)
        self.ensure_parent(path)
        self.entries[path] = ("link", target, 0o777, uid, gid)

    def ensure_parent(self, path):
        parent = os.path.dirname(path)
        if parent != "/" and parent not in self.entries:
            self.add_dir(parent)

    def copy_from_host(self, src, dst, chown):
        """Docker's COPY: a directory's contents go into dst; a file to dst (or dst/name)."""
        if os.path.islink(src) or os.path.isfile(src):
            if dst.endswith("/"):
                dst = dst + os.path.basename(src)
            self.copy_one(src, dst, chown)
        elif os.path.isdir(src):
            uid, gid = chown if chown else (0, 0)
            if norm(dst) not in self.entries:
                self.add_dir(dst, 0o755, uid, gid)
            elif chown:
                kind, data, mode, _, _ = self.entries[norm(dst)]
                self.entries[norm(dst)] = (kind, data, mode, uid, gid)
            for name in sorted(os.listdir(src)):
                self.copy_from_host(os.path.join(src, name),
                                    norm(dst) + "/" + name + ("/" if os.path.isdir(os.path.join(src, name)) and not os.path.islink(os.path.join(src, name)) else ""),
                                    chown)
        else:
            die(f"{src} does not exist")

    def copy_one(self, src, dst, chown):
        uid, gid = chown if chown else (0, 0)
        if os.path.islink(src):
            self.add_link(dst, os.readlink(src), uid, gid)
        else:
            with open(src, "rb") as f:
                data = f.read()
            mode = 0o755 if os.access(src, os.X_OK) else 0o644
            self.add_file(dst, data, mode, uid, gid)

    def plan(self):
        out = []
        for path in sorted(self.entries):
            kind, data, mode, uid, gid = self.entries[path]
            item = {"path": path, "type": kind, "mode": oct(mode), "uid": uid, "gid": gid}
            if kind == "file":
                item["sha256"] = hashlib.sha256(data).hexdigest()
            if kind == "link":
                item["target"] = data
            out.append(item)
        return out

    def layer(self, mtime):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, data, mode, uid, gid = self.entries[path]
                info = tarfile.TarInfo(path.lstrip("/"))
                info.mode, info.uid, info.gid, info.mtime = mode, uid, gid, mtime
                info.uname = info.gname = ""
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif kind == "link":
                    info.type, info.linkname = tarfile.SYMTYPE, data
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


def norm(path):
    return os.path.normpath("/" + path.strip().lstrip("/"))


def blob(content):
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    return digest, content


def write_archive(out, ref, tree, config, mtime):
    layer_digest, layer = blob(tree.layer(mtime))
    created = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    image_config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": created, "created_by": "hack/oci-image.py"}],
    }
    config_digest, config_bytes = blob(json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_bytes = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
        }],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
    }
    for digest, content in ((layer_digest, layer), (config_digest, config_bytes), (manifest_digest, manifest_bytes)):
        files["blobs/sha256/" + digest.split(":")[1]] = content
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, mtime
            tar.addfile(info, io.BytesIO(files[name]))
    os.replace(tmp, out)
    return manifest_digest


def instructions(text):
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def substitute(text, args):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def dockerfile_image(path, stages, build_args):
    """Reads the last stage of the Dockerfile at `path` into (tree, config, base)."""
    with open(path) as f:
        steps = instructions(f.read())
    global_args, stage_args, last_from = {}, {}, None
    for i, (keyword, rest) in enumerate(steps):
        if keyword == "FROM":
            last_from = i
        elif keyword == "ARG" and last_from is None:
            name, _, default = rest.partition("=")
            global_args[name] = build_args.get(name, default.strip('"'))
    if last_from is None:
        die(f"{path}: no FROM")
    base = substitute(steps[last_from][1].split()[0], global_args)
    if " AS " in steps[last_from][1].upper():
        die(f"{path}: the last stage must be the image (no AS)")
    if base not in BASES:
        die(f"{path}: the last stage's base {base} is not one this script reproduces ({', '.join(BASES)})")
    tree = Tree()
    tree.add_dir("/etc")
    tree.add_file("/etc/passwd", PASSWD.encode())
    tree.add_file("/etc/group", GROUP.encode())
    if not os.path.isfile(CA_BUNDLE):
        die(f"{CA_BUNDLE} is missing: install Debian's ca-certificates package")
    with open(CA_BUNDLE, "rb") as f:
        tree.add_file(CA_BUNDLE, f.read())
    tree.add_dir("/tmp", 0o1777)
    tree.add_dir("/home/nonroot", 0o700, 65532, 65532)
    tree.add_dir("/usr/local/bin")
    config = {"User": BASES[base]["user"], "Env": list(BASES[base]["env"]),
              "WorkingDir": BASES[base]["workdir"], "Labels": {}}
    args = dict(global_args)
    for keyword, rest in steps[last_from + 1:]:
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, default.strip('"'))
        elif keyword == "LABEL":
            for item in shlex.split(substitute(rest, args)):
                key, _, value = item.partition("=")
                config["Labels"][key] = value
        elif keyword == "COPY":
            words = rest.split()
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            source_stage, chown = None, None
            for flag in flags:
                name, _, value = flag[2:].partition("=")
                if name == "from":
                    source_stage = value
                elif name == "chown":
                    user, _, group = value.partition(":")
                    chown = (int(user), int(group or user))
                else:
                    die(f"{path}: COPY --{name} is not supported by this script")
            if source_stage is None:
                die(f"{path}: COPY without --from (a file of the build context) is not supported: {rest}")
            if source_stage not in stages:
                die(f"{path}: COPY --from={source_stage}: no directory given for stage {source_stage} (--stage {source_stage}=DIR)")
            *sources, dst = paths
            for src in sources:
                host = os.path.join(stages[source_stage], src.lstrip("/"))
                if not os.path.lexists(host.rstrip("/")):
                    die(f"{path}: COPY --from={source_stage} {src}: {host} does not exist")
                if os.path.isdir(host) and not os.path.islink(host.rstrip("/")):
                    tree.copy_from_host(host, dst, chown)
                else:
                    tree.copy_from_host(host.rstrip("/"), dst, chown)
        elif keyword == "USER":
            config["User"] = substitute(rest, args)
        elif keyword in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                die(f"{path}: {keyword} must be in the JSON (exec) form: {rest}")
            config["Entrypoint" if keyword == "ENTRYPOINT" else "Cmd"] = value
        else:
            die(f"{path}: {keyword} in the image's stage is not supported by this script: "
                f"teach hack/oci-image.py what it does, or keep it in a builder stage")
    return tree, config


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dockerfile")
    d.add_argument("--dockerfile", required=True)
    d.add_argument("--ref", required=True)
    d.add_argument("--stage", action="append", default=[], help="NAME=DIR")
    d.add_argument("--build-arg", action="append", default=[], help="NAME=VALUE")
    d.add_argument("--add", action="append", default=[],
                   help="SRC=DST: a host directory added at DST, owned by 65532 (an image FROM this "
                        "one with charts in /charts: docs/deploy.md)")
    d.add_argument("--out")
    d.add_argument("--plan", action="store_true")
    f = sub.add_parser("files")
    f.add_argument("--ref", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--file", action="append", default=[], help="SRC:DST")
    f.add_argument("--entrypoint", required=True, help="JSON array")
    a = parser.parse_args()
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    if a.command == "dockerfile":
        stages = {}
        for s in a.stage:
            name, sep, directory = s.partition("=")
            if not sep or not os.path.isdir(directory):
                die(f"--stage {s}: expected NAME=DIR with an existing directory")
            stages[name] = directory
        build_args = dict(x.partition("=")[::2] for x in a.build_arg)
        tree, config = dockerfile_image(a.dockerfile, stages, build_args)
        for add in a.add:
            src, sep, dst = add.partition("=")
            if not sep or not os.path.isdir(src):
                die(f"--add {add}: expected SRC=DST with an existing directory")
            tree.copy_from_host(src, dst, (65532, 65532))
        if a.plan:
            json.dump({"config": config, "files": tree.plan()}, sys.stdout, indent=1, sort_keys=True)
            print()
            return
        if not a.out:
            die("--out is required unless --plan")
        print(write_archive(a.out, a.ref, tree, config, mtime))
    else:
        tree = Tree()
        for spec in a.file:
            src, sep, dst = spec.partition(":")
            if not sep or not os.path.isfile(src):
                die(f"--file {spec}: expected SRC:DST with an existing file")
            tree.copy_one(src, dst, None)
        print(write_archive(a.out, a.ref, tree, {"Entrypoint": json.loads(a.entrypoint)}, mtime))


if __name__ == "__main__":
    main()
