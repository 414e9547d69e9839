# shellcheck shell=bash
# Hosts on this machine, sourced by scripts/sim-cluster and scripts/slurm-cluster: each host a network
# namespace with one veth link (kfsdp0 inside) to a bridge in this namespace. Needs root and iproute2.
#
#   sim_hosts_up N SUBNET FIRST [BRIDGE_ADDRESS]   hosts 0..N-1, host i at SUBNET.(FIRST+i)/24; the
#                                                  bridge gets SUBNET.BRIDGE_ADDRESS where given
#   sim_host_ns I / sim_host_link I / sim_host_addr I    host I's namespace, its link's outer end, address
#   sim_host_exec I COMMAND...                     COMMAND in host I's network namespace
#   sim_hosts_down                                 end what runs in the hosts, remove links, namespaces, bridge
#
# Names carry this shell's pid (interface names stay within 15 characters), so that runs side by side
# and leftovers of a killed one never clash.
sim_hosts_id=$$ sim_hosts_count=0 sim_hosts_subnet="" sim_hosts_first=1
sim_hosts_bridge="ks${sim_hosts_id}br"
sim_host_ns() { echo "kfsdp-sim-$sim_hosts_id-h$1"; }
sim_host_link() { echo "ks${sim_hosts_id}h$1"; }
sim_host_addr() { echo "$sim_hosts_subnet.$((sim_hosts_first + $1))"; }

sim_hosts_up() {
  local i
  sim_hosts_count=$1 sim_hosts_subnet=$2 sim_hosts_first=$3
  ip link add "$sim_hosts_bridge" type bridge
  [ -z "${4:-}" ] || ip addr add "$sim_hosts_subnet.$4/24" dev "$sim_hosts_bridge"
  ip link set "$sim_hosts_bridge" up
  for ((i = 0; i < sim_hosts_count; i++)); do
    ip netns add "$(sim_host_ns "$i")"
    ip -n "$(sim_host_ns "$i")" link set lo up
    ip link add "$(sim_host_link "$i")" type veth peer name kfsdp0 netns "$(sim_host_ns "$i")"
    ip link set "$(sim_host_link "$i")" master "$sim_hosts_bridge" up
    ip -n "$(sim_host_ns "$i")" addr add "$(sim_host_addr "$i")/24" dev kfsdp0
    ip -n "$(sim_host_ns "$i")" link set kfsdp0 up
  done
}

# nsenter rather than `ip netns exec`: the latter mounts a fresh /sys, without the cgroup hierarchy
# that slurmd wants on a cgroup v1 kernel.
sim_host_exec() { local i=$1; shift; nsenter --net="/run/netns/$(sim_host_ns "$i")" "$@"; }

sim_hosts_down() {
  local i pid
  for ((i = 0; i < sim_hosts_count; i++)); do
    # Processes left in a host (a rank that hung) would keep its namespace alive: end them first.
    for pid in $(ip netns pids "$(sim_host_ns "$i")" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip link del "$(sim_host_link "$i")" 2>/dev/null || true
    ip netns del "$(sim_host_ns "$i")" 2>/dev/null || true
  done
  ip link del "$sim_hosts_bridge" 2>/dev/null || true
}
