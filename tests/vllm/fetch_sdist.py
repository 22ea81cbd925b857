"""Download one release's source distribution of vLLM from the package index, hash-checked.

    python fetch_sdist.py VERSION SHA256 DEST

pip cannot download vLLM's sdist without building its metadata (which needs CUDA build
tools), so this asks the index's JSON simple API (PEP 691) for the file's address instead.
The index is $PIP_INDEX_URL, or PyPI. Exits non-zero, saying why, when the index cannot be
reached, the release has no sdist, or the hash differs.
"""

import hashlib
import json
import os
import sys
import urllib.request


def main() -> int:
    version, sha256, dest = sys.argv[1:4]
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    request = urllib.request.Request(
        f"{index}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    name = f"vllm-{version}.tar.gz"
    match = [f for f in files if f["filename"] == name]
    if not match:
        print(f"fetch_sdist: {index} lists no {name}", file=sys.stderr)
        return 1
    data = urllib.request.urlopen(match[0]["url"], timeout=300).read()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        print(f"fetch_sdist: {name} has sha256 {got}, expected {sha256}", file=sys.stderr)
        return 1
    tmp = dest + ".part"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, dest)
    print(f"fetch_sdist: {name} ({len(data) // 1_000_000} MB) -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
