#!/usr/bin/env bash
# A cluster CA and one certificate for the cluster's nodes (docs/CLUSTER.md, "TLS"), with
# openssl: nodes serve HTTPS with it (kvd serve --tls-cert/--tls-key) and routers verify them
# against the CA (kvd router --ca-cert). The node certificate names every address given (IPs
# and DNS names; default 127.0.0.1 and localhost, for a cluster on one machine).
#
#   tools/cluster/make_certs.sh DIR [ADDRESS...]
#   -> DIR/ca.pem DIR/ca.key DIR/node.pem DIR/node.key   (keys readable by the owner only)
set -euo pipefail
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || {
  echo "usage: tools/cluster/make_certs.sh DIR [ADDRESS...]   (default: 127.0.0.1 localhost)"
  exit 2
}
DIR="$1"; shift
ADDRESSES=("$@")
[[ ${#ADDRESSES[@]} -gt 0 ]] || ADDRESSES=(127.0.0.1 localhost)
command -v openssl > /dev/null || { echo "make_certs.sh: openssl is missing (tools/setup.sh)" >&2; exit 1; }
mkdir -p "$DIR"
umask 077
SAN=""
for a in "${ADDRESSES[@]}"; do
  if [[ "$a" =~ ^[0-9.]+$ || "$a" == *:* ]]; then SAN+="IP:$a,"; else SAN+="DNS:$a,"; fi
done
SAN="${SAN%,}"
if [[ ! -s "$DIR/ca.key" ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kvd cluster CA" \
    -keyout "$DIR/ca.key" -out "$DIR/ca.pem" 2> /dev/null
fi
openssl req -newkey rsa:2048 -nodes -subj "/CN=kvd node" -keyout "$DIR/node.key" \
  -out "$DIR/node.csr" 2> /dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
  "$SAN" > "$DIR/node.ext"
openssl x509 -req -in "$DIR/node.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial \
  -days 825 -extfile "$DIR/node.ext" -out "$DIR/node.pem" 2> /dev/null
rm -f "$DIR/node.csr" "$DIR/node.ext" "$DIR/ca.srl"
chmod 644 "$DIR/ca.pem" "$DIR/node.pem"
echo "make_certs.sh: CA $DIR/ca.pem, node certificate $DIR/node.pem for $SAN"
