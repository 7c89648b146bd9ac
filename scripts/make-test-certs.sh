#!/usr/bin/env bash
# Makes a throwaway certificate authority and certificates for tests and local TLS trials:
#   ca.pem                      the CA (give it to clients: CLEAVE_TLS_CA, --router-ca)
#   server.pem, server.key      the router's (127.0.0.1 and localhost; --tls-cert/--tls-key),
#                               also its client certificate when it calls workers
#   worker.pem, worker.key      a worker's (127.0.0.1 and localhost; cleave-worker
#                               --tls-cert/--tls-key): served on its port, shown to the router
#   rogue-worker.pem/.key       a client certificate from another CA (must be refused)
# Usage: scripts/make-test-certs.sh DIR    (never use these keys for anything real)
set -euo pipefail
dir=${1:?usage: make-test-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
days=30
quiet() { "$@" >/dev/null 2>&1 || { echo "make-test-certs: failed: $*" >&2; exit 1; }; }

# ca NAME: a self-signed CA in NAME.pem / NAME.key.
ca() {
  quiet openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=cleave test $1" \
    -keyout "$1.key" -out "$1.pem"
}
# leaf NAME CA EXT: a certificate for NAME signed by CA, with the extensions EXT.
leaf() {
  quiet openssl req -newkey rsa:2048 -nodes -subj "/CN=cleave-$1" -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  quiet openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
    -days "$days" -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}

ca ca
ca rogue-ca
leaf server ca "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth"
leaf worker ca "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth"
leaf rogue-worker rogue-ca "extendedKeyUsage=clientAuth"
rm -f ./*.srl
echo "certificates in $dir"
