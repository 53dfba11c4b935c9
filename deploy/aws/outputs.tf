output "nlb_address" {
  description = "Where clients connect: postgres://app:PASSWORD@<this>:6432/<database>."
  value       = aws_lb.routers.dns_name
}

output "shardmap_uri" {
  description = "The shard map every router and load generator fetches at boot."
  value       = local.shardmap_uri
}

output "reports_uri" {
  description = "Where the load generators upload their reports (scripts/scale-run.sh merges them)."
  value       = local.reports_uri
}

output "primary_url_template" {
  description = "The --primary template to render the shard map with (shardgate shardmap split)."
  value       = module.layout.primary_url_template
}

output "admin_console" {
  description = "How to reach a router's admin console and metrics (from operator_cidrs or inside the VPC)."
  value       = "psql -h ROUTER_PRIVATE_IP -p 6432 -U admin shardgate; curl http://ROUTER_PRIVATE_IP:9930/metrics; router IPs: aws ec2 describe-instances --filters Name=tag:Role,Values=router Name=tag:Fleet,Values=${var.name} --query 'Reservations[].Instances[].PrivateIpAddress'"
}

output "backend_connections_per_primary" {
  description = "The connection budget: backend connections each primary accepts (max_connections is this plus a reserve)."
  value       = module.layout.backend_connections_per_primary
}

output "cost_per_hour_usd" {
  description = "On-demand cost per hour of the instances (var.hourly_price; NAT, NLB, EBS and traffic not included)."
  value = (
    var.shard_count * lookup(var.hourly_price, var.primary_instance_type, 0) +
    var.router_count * lookup(var.hourly_price, var.router_instance_type, 0) +
    var.loadgen_count * lookup(var.hourly_price, var.loadgen_instance_type, 0)
  )
}
