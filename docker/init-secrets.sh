#!/bin/sh
# Make the Docker secrets docker-compose.yml mounts, in ./secrets (or the directory given
# as $1, or $KEYSEED_SECRETS_DIR). Files that exist are kept: the document key in
# particular must never change once documents are stored (they could not be decrypted).
#
#   data_key              base64 of 32 random bytes: AES-256-GCM key of documents at rest
#   postgres_password     random; read by Postgres when its volume is first initialised
#   openai_api_key        empty: put your OpenAI key here if an endpoint uses it
#   azure_openai_api_key  empty: put your Azure OpenAI key here if an endpoint uses it
#
# The directory is 0700 (only you can enter it); the files are 0444 because the
# containers run as uid 10001 and Compose bind-mounts secrets with the host's modes.
set -eu

dir=${1:-${KEYSEED_SECRETS_DIR:-./secrets}}
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"

random_base64() {
    head -c "$1" /dev/urandom | base64 | tr -d '\n'
}

write() {
    name=$1
    value=$2
    if [ -e "$dir/$name" ]; then
        echo "kept $dir/$name"
        return
    fi
    printf '%s' "$value" > "$dir/$name.tmp"
    chmod 0444 "$dir/$name.tmp"
    mv "$dir/$name.tmp" "$dir/$name"
    echo "made $dir/$name"
}

write data_key "$(random_base64 32)"
write postgres_password "$(random_base64 33 | tr '+/' '-_')"
write openai_api_key ""
write azure_openai_api_key ""
echo "Back up $dir/data_key: without it the stored documents cannot be decrypted."
