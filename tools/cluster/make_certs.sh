#!/usr/bin/env bash
# The cluster's certificates (docs/CLUSTER.md, "Identity and TLS"), with openssl: a cluster CA
# and one certificate per node and per router, naming what it is in its common name
# ("node:ID", "router:ID"). Nodes serve HTTPS and gRPC with theirs and present it to the peers
# they move sessions to; routers present theirs to nodes. Each side verifies the other against
# the CA (mutual TLS), and a node authorizes a peer's call by the identity its certificate
# names: only nodes may write checkpoints (kvd.v1.Migration), only routers and nodes may send
# the router token. The certificate names every address given (IPs and DNS names; default
# 127.0.0.1 and localhost, for a cluster on one machine). The CA is made once per DIR and
# reused.
#
#   tools/cluster/make_certs.sh DIR --node ID [ADDRESS...]   -> DIR/node-ID.pem DIR/node-ID.key
#   tools/cluster/make_certs.sh DIR --router ID [ADDRESS...] -> DIR/router-ID.pem DIR/router-ID.key
#   tools/cluster/make_certs.sh DIR --etcd NAME [ADDRESS...] -> DIR/etcd-NAME.pem ...   (an etcd member)
#   tools/cluster/make_certs.sh DIR --client NAME            -> DIR/client-NAME.pem ... (common name
#     NAME: an etcd user such as root, for `kvd cluster etcd-auth` and operators' tools)
#   tools/cluster/make_certs.sh DIR [ADDRESS...]             -> DIR/node.pem DIR/node.key
#     (one certificate for every node, naming no identity: TLS without mutual authentication;
#      peers are then trusted by the router token alone)
#   and DIR/ca.pem DIR/ca.key; keys readable by the owner only.
set -euo pipefail
usage="usage: tools/cluster/make_certs.sh DIR [--node ID | --router ID | --etcd NAME | --client NAME] [ADDRESS...]   (default address: 127.0.0.1 localhost)"
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || { echo "$usage"; exit 2; }
DIR="$1"; shift
ROLE=""; ID=""
if [[ $# -ge 1 && ( "$1" == --node || "$1" == --router || "$1" == --etcd || "$1" == --client ) ]]; then
  [[ $# -ge 2 && -n "$2" ]] || { echo "$usage" >&2; exit 2; }
  ROLE="${1#--}"; ID="$2"; shift 2
  [[ "$ID" =~ ^[A-Za-z0-9._-]+$ && "$ID" != . && "$ID" != .. ]] || {
    echo "make_certs.sh: '$ID' is not a node or router id ([A-Za-z0-9._-]+)" >&2; exit 2; }
fi
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
if [[ "$ROLE" == client ]]; then
  NAME="client-$ID"; CN="$ID"
elif [[ -n "$ROLE" ]]; then
  NAME="$ROLE-$ID"; CN="$ROLE:$ID"
else
  NAME="node"; CN="kvd node"
fi
# A lock per DIR: several certificates issued at once share the CA's serial file.
exec 9> "$DIR/.lock"
flock 9
openssl req -newkey rsa:2048 -nodes -subj "/O=kvd/CN=$CN" -keyout "$DIR/$NAME.key" \
  -out "$DIR/$NAME.csr" 2> /dev/null
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
  "$SAN" > "$DIR/$NAME.ext"
openssl x509 -req -in "$DIR/$NAME.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial \
  -days 825 -extfile "$DIR/$NAME.ext" -out "$DIR/$NAME.pem" 2> /dev/null
rm -f "$DIR/$NAME.csr" "$DIR/$NAME.ext"
chmod 644 "$DIR/ca.pem" "$DIR/$NAME.pem"
echo "make_certs.sh: CA $DIR/ca.pem, certificate $DIR/$NAME.pem ($CN) for $SAN"
