# The fleet's layout as plain arithmetic: which shard lives where, what its primary is called,
# which subnet each availability zone gets, and how many backend connections every primary must
# accept. No provider and no resource, so `terraform init`, `validate` and `test` run offline;
# the fleet's modules take their names, counts and sizes from here.

terraform {
  required_version = ">= 1.6"
}

locals {
  az_count = length(var.azs)

  shards = [
    for i in range(var.shard_count) : {
      index = i
      name  = format("shard-%03d", i)
      dns   = format("shard-%03d.%s", i, var.dns_zone)
      az    = var.azs[i % local.az_count]
    }
  ]

  # One private subnet per AZ for the primaries and one for the routers and load generators,
  # carved from the VPC range: /20s of a /16 by default.
  primary_subnets = [for i in range(local.az_count) : cidrsubnet(var.vpc_cidr, var.subnet_newbits, i)]
  client_subnets  = [for i in range(local.az_count) : cidrsubnet(var.vpc_cidr, var.subnet_newbits, local.az_count + i)]

  # Today every router worker thread keeps its own pool per shard: a primary sees at least one
  # connection per router worker, up to the pool size under load.
  backend_connections_per_primary = var.router_count * (var.shared_connections + var.router_workers * var.pool_connections_per_worker)
  max_connections                 = local.backend_connections_per_primary + var.reserved_connections
}
