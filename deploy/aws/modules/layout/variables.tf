variable "shard_count" {
  description = "Shards, one Postgres primary each."
  type        = number
  default     = 512
  validation {
    condition     = var.shard_count >= 1 && var.shard_count <= 4096 && floor(var.shard_count) == var.shard_count
    error_message = "shard_count must be a whole number from 1 to 4096 (shardgate's shard map limit)."
  }
}

variable "azs" {
  description = "Availability zones to spread the primaries and routers over, e.g. [\"us-east-1a\", \"us-east-1b\", \"us-east-1c\"]."
  type        = list(string)
  validation {
    condition     = length(var.azs) >= 1 && length(distinct(var.azs)) == length(var.azs)
    error_message = "azs must name at least one availability zone, each once."
  }
}

variable "vpc_cidr" {
  description = "The VPC's address range; subnets are carved from it."
  type        = string
  default     = "10.40.0.0/16"
  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "vpc_cidr must be an IPv4 CIDR block such as 10.40.0.0/16."
  }
}

variable "subnet_newbits" {
  description = "Bits added to the VPC prefix for each subnet (4: /20s of a /16, 4096 addresses each)."
  type        = number
  default     = 4
}

variable "dns_zone" {
  description = "Private DNS zone of the primaries: shard 7 is shard-007.<zone>."
  type        = string
  default     = "db.internal"
  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$", var.dns_zone))
    error_message = "dns_zone must be a lower-case DNS name with at least two labels, e.g. db.internal."
  }
}

variable "router_count" {
  description = "Router instances."
  type        = number
  default     = 138
  validation {
    condition     = var.router_count >= 1
    error_message = "router_count must be at least 1."
  }
}

variable "router_workers" {
  description = "Worker threads per router (shardgate's default: one per vCPU; 32 on an 8xlarge)."
  type        = number
  default     = 32
  validation {
    condition     = var.router_workers >= 1
    error_message = "router_workers must be at least 1."
  }
}

variable "pool_connections_per_worker" {
  description = "Backend connections each router worker keeps to each shard at least (1: the pool's floor under steady load)."
  type        = number
  default     = 1
}

variable "shared_connections" {
  description = "The routers' [pool] shared_connections: connections per router and shard besides the pools."
  type        = number
  default     = 0
}

variable "reserved_connections" {
  description = "Connections each primary keeps free beyond the routers' (superuser, replication, monitoring, resharding)."
  type        = number
  default     = 50
}

variable "database" {
  description = "The shard database on every primary."
  type        = string
  default     = "shard"
}

variable "port" {
  description = "Postgres port of the primaries."
  type        = number
  default     = 5432
}
