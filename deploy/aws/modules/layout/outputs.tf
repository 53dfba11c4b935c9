output "shards" {
  description = "Every shard: index, name (shard-007), private DNS name and availability zone (round robin)."
  value       = local.shards
}

output "primary_subnets" {
  description = "One subnet CIDR per availability zone for the primaries, in the order of var.azs."
  value       = local.primary_subnets
}

output "client_subnets" {
  description = "One subnet CIDR per availability zone for routers and load generators."
  value       = local.client_subnets
}

output "primary_url_template" {
  description = "The --primary template of `shardgate shardmap split --shards N`, which renders the shard map before any primary exists. No login: routers log in with their [backend] user and password."
  value       = format("postgres://shard-{index:3}.%s:%d/%s", var.dns_zone, var.port, var.database)
}

output "backend_connections_per_primary" {
  description = "Backend connections a primary must accept from the routers (routers x workers x pool floor)."
  value       = local.backend_connections_per_primary
}

output "max_connections" {
  description = "max_connections for every primary's postgresql.conf."
  value       = local.max_connections
}
