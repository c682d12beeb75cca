# shellcheck shell=bash disable=SC2034
# Helpers shared by infra/cluster/*.sh (sourced). Builds on infra/engines/lib.sh (the same jar
# cache, PID handling and timing helpers) with the cluster's own folder, addresses and ports.
#
# Settings (environment):
#   FANOUT_CLUSTER_DIR               data, pids, logs, cluster.env (default /tmp/fanout-cluster)
#   FANOUT_CLUSTER_HOSTS             the three loopback addresses (default "127.0.0.2 127.0.0.3 127.0.0.4")
#   FANOUT_CLUSTER_CASSANDRA_PORT    CQL port on every node (default 29042); storage 27000
#   FANOUT_CLUSTER_CASSANDRA_HEAP    -Xms/-Xmx per node (default 1g)
#   FANOUT_CLUSTER_CASSANDRA_COMMITLOG  batch (default) | group | periodic, as infra/engines
#   FANOUT_CLUSTER_KAFKA_PORT        client port on every broker (default 29092); controller 29093
#   FANOUT_CLUSTER_KAFKA_HEAP        -Xmx per broker (default 512m)
#   FANOUT_CLUSTER_POSTGRES_PORT     the cluster's own PostgreSQL on 127.0.0.1 (default 25432)
#   FANOUT_CLUSTER_PARTITIONS        partitions of the event topic in the URL (default 6)
#   FANOUT_CLUSTER_FRESH=1           wipe every node's data before starting
# plus FANOUT_ENGINES_CACHE and FANOUT_ENGINES_START_TIMEOUT from infra/engines/lib.sh.
CLUSTER_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../engines/lib.sh
. "$CLUSTER_HERE/../engines/lib.sh"
CLUSTER_DIR="${FANOUT_CLUSTER_DIR:-/tmp/fanout-cluster}"
read -r -a CLUSTER_HOSTS <<< "${FANOUT_CLUSTER_HOSTS:-127.0.0.2 127.0.0.3 127.0.0.4}"
C_PORT="${FANOUT_CLUSTER_CASSANDRA_PORT:-29042}"
C_SPORT="${FANOUT_CLUSTER_CASSANDRA_STORAGE_PORT:-27000}"
C_HEAP="${FANOUT_CLUSTER_CASSANDRA_HEAP:-1g}"
K_PORT="${FANOUT_CLUSTER_KAFKA_PORT:-29092}"
K_CPORT="${FANOUT_CLUSTER_KAFKA_CONTROLLER_PORT:-29093}"
K_HEAP="${FANOUT_CLUSTER_KAFKA_HEAP:-512m}"
PG_PORT="${FANOUT_CLUSTER_POSTGRES_PORT:-25432}"
# node N (1..3) -> its address
host_of() { echo "${CLUSTER_HOSTS[$(($1 - 1))]}"; }
csv_hosts() { local IFS=,; echo "${CLUSTER_HOSTS[*]}"; }
