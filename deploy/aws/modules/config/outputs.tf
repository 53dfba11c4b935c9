output "postgresql_conf" {
  description = "A shard primary's postgresql.conf (to include from the distribution's file)."
  value       = local.postgresql_conf
}

output "router_toml" {
  description = "A router's router.toml (holds passwords: pass it on as a secret)."
  value       = local.router_toml
  sensitive   = true
}

output "huge_pages" {
  description = "vm.nr_hugepages a primary reserves for shared_buffers (2 MiB pages)."
  value       = local.huge_pages_count
}

output "shared_buffers_mb" {
  description = "shared_buffers of a primary, in MB."
  value       = local.shared_buffers_mb
}

output "deregistration_delay_s" {
  description = "The NLB target group's deregistration delay: the router's drain timeout, in seconds."
  value       = ceil(var.drain_timeout_ms / 1000)
}
