#!/usr/bin/env bash
# vendor-assets.sh — reproduce the front-end files vendored in views/static/.
#
# Nothing is fetched at run time: the app serves these files from the binary
# (go:embed). This script is how they were obtained, and re-running it must
# produce byte-identical files (check with `git diff --stat views/static`).
#
#   htmx       -> views/static/htmx-<version>.min.js   (from dist/htmx.min.js)
#   Pico CSS   -> views/static/pico.min.css            (from css/pico.min.css;
#                 its banner comment carries the version)
#   licenses   -> views/static/LICENSES.md
#
# Requires npm (npm pack downloads the published tarball and checks its
# integrity against the package metadata). Versions are pinned exactly.
set -euo pipefail

HTMX_VERSION="${HTMX_VERSION:-2.0.11}"
PICO_VERSION="${PICO_VERSION:-2.1.1}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
static="$root/views/static"

command -v npm >/dev/null || { echo "vendor-assets: npm is required" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
npm pack --silent "htmx.org@${HTMX_VERSION}" "@picocss/pico@${PICO_VERSION}" >/dev/null

mkdir htmx pico
tar -xzf "htmx.org-${HTMX_VERSION}.tgz" -C htmx
tar -xzf "picocss-pico-${PICO_VERSION}.tgz" -C pico

# Guard against a tarball that is not the version we asked for.
grep -q "\"version\": \"${HTMX_VERSION}\"" htmx/package/package.json
grep -q "\"version\": \"${PICO_VERSION}\"" pico/package/package.json

mkdir -p "$static"
# Drop older htmx builds so only the pinned one is embedded.
find "$static" -maxdepth 1 -name 'htmx-*.min.js' ! -name "htmx-${HTMX_VERSION}.min.js" -delete
cp htmx/package/dist/htmx.min.js "$static/htmx-${HTMX_VERSION}.min.js"
cp pico/package/css/pico.min.css "$static/pico.min.css"

{
	printf '# Third-party front-end assets\n\n'
	printf 'Vendored by `scripts/vendor-assets.sh`; served from the binary, never fetched at run time.\n\n'
	printf '| file | package | version | license |\n'
	printf '| --- | --- | --- | --- |\n'
	printf '| `htmx-%s.min.js` | htmx.org (`dist/htmx.min.js`) | %s | 0BSD |\n' "$HTMX_VERSION" "$HTMX_VERSION"
	printf '| `pico.min.css` | @picocss/pico (`css/pico.min.css`) | %s | MIT |\n' "$PICO_VERSION"
	printf '\n## htmx %s\n\n```text\n' "$HTMX_VERSION"
	cat htmx/package/LICENSE
	printf '```\n\n## Pico CSS %s\n\n```text\n' "$PICO_VERSION"
	cat pico/package/LICENSE.md
	printf '```\n'
} >"$static/LICENSES.md"

cd "$static"
sha256sum "htmx-${HTMX_VERSION}.min.js" pico.min.css
