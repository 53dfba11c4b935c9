variable "name" {
  description = "Name of this fleet: prefixes every resource and tags it (Fleet = name)."
  type        = string
  default     = "shardgate"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.name))
    error_message = "name must be 2 to 21 lower-case letters, digits or dashes, starting with a letter."
  }
}

variable "region" {
  description = "AWS region, e.g. us-east-1."
  type        = string
}

variable "azs" {
  description = "Availability zones of the region to spread primaries, routers and load generators over."
  type        = list(string)
  validation {
    condition     = length(var.azs) >= 1 && length(distinct(var.azs)) == length(var.azs)
    error_message = "azs must name at least one availability zone, each once."
  }
}

variable "vpc_id" {
  description = "An existing VPC to use (its private subnets are created from vpc_cidr inside it); null creates a VPC."
  type        = string
  default     = null
}

variable "private_route_table_id" {
  description = "With vpc_id: the route table (with a route to a NAT and, ideally, an S3 endpoint) the fleet's private subnets use; the instances install packages and fetch from S3 at boot."
  type        = string
  default     = null
}

variable "vpc_cidr" {
  description = "The new VPC's range, or a free range inside the existing vpc_id for this fleet's subnets."
  type        = string
  default     = "10.40.0.0/16"
  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0))
    error_message = "vpc_cidr must be an IPv4 CIDR block such as 10.40.0.0/16."
  }
}

variable "shard_count" {
  description = "Shards, one Postgres primary each."
  type        = number
  default     = 512
  validation {
    condition     = var.shard_count >= 1 && var.shard_count <= 4096 && floor(var.shard_count) == var.shard_count
    error_message = "shard_count must be a whole number from 1 to 4096."
  }
}

variable "primary_instance_type" {
  description = "Instance type of the shard primaries (Graviton)."
  type        = string
  default     = "r8g.16xlarge"
  validation {
    condition     = can(regex("^[a-z][0-9]+g[a-z]*\\.", var.primary_instance_type))
    error_message = "primary_instance_type must be a Graviton (arm64) type such as r8g.16xlarge."
  }
}

variable "primary_memory_gib" {
  description = "Memory of primary_instance_type in GiB (sizes postgresql.conf): r8g.16xlarge 512."
  type        = number
  default     = 512
}

variable "primary_vcpus" {
  description = "vCPUs of primary_instance_type: r8g.16xlarge 64."
  type        = number
  default     = 64
}

variable "primary_volume_gb" {
  description = "Size of each primary's data volume (gp3) in GB."
  type        = number
  default     = 500
  validation {
    condition     = var.primary_volume_gb >= 20
    error_message = "primary_volume_gb must be at least 20."
  }
}

variable "primary_volume_iops" {
  description = "Provisioned IOPS of each data volume (gp3: 3000 to 16000)."
  type        = number
  default     = 16000
  validation {
    condition     = var.primary_volume_iops >= 3000 && var.primary_volume_iops <= 16000
    error_message = "gp3 allows 3000 to 16000 IOPS."
  }
}

variable "postgres_version" {
  description = "PostgreSQL major version, from the distribution's packages (Debian 12 ships 15)."
  type        = string
  default     = "15"
  validation {
    condition     = contains(["15"], var.postgres_version)
    error_message = "the Debian 12 AMI ships PostgreSQL 15; other majors need the PGDG repository, which this module does not add."
  }
}

variable "router_instance_type" {
  description = "Instance type of the routers (Graviton)."
  type        = string
  default     = "c8g.8xlarge"
  validation {
    condition     = can(regex("^[a-z][0-9]+g[a-z]*\\.", var.router_instance_type))
    error_message = "router_instance_type must be a Graviton (arm64) type such as c8g.8xlarge."
  }
}

variable "router_count" {
  description = "Routers (the auto-scaling group's size); docs/capacity.md sizes it for a load."
  type        = number
  default     = 138
  validation {
    condition     = var.router_count >= 1
    error_message = "router_count must be at least 1."
  }
}

variable "router_workers" {
  description = "Worker threads per router: its vCPUs (c8g.8xlarge: 32)."
  type        = number
  default     = 32
}

variable "pool_max_size" {
  description = "[pool] max_size of the routers: backend connections per worker and shard at most."
  type        = number
  default     = 4
}

variable "shared_connections" {
  description = "[pool] shared_connections of the routers: backend connections per router and shard that pipeline all clients' autocommit statements (docs/capacity.md#backend-connections-per-primary)."
  type        = number
  default     = 1
}

variable "loadgen_instance_type" {
  description = "Instance type of the load generators (Graviton); docs/capacity.md sizes them (64 vCPUs each)."
  type        = string
  default     = "c8g.16xlarge"
}

variable "loadgen_count" {
  description = "Load generators (0: none); docs/capacity.md: 37 for the record's load."
  type        = number
  default     = 37
  validation {
    condition     = var.loadgen_count >= 0
    error_message = "loadgen_count must be 0 or more."
  }
}

variable "key_name" {
  description = "An EC2 key pair for SSH; null for SSM Session Manager only (no SSH port is opened either way)."
  type        = string
  default     = null
}

variable "client_cidrs" {
  description = "Networks allowed to connect to the NLB (Postgres clients)."
  type        = list(string)
  default     = []
}

variable "operator_cidrs" {
  description = "Networks allowed to reach the routers' admin console and /metrics directly."
  type        = list(string)
  default     = []
}

variable "artifact_bucket" {
  description = "S3 bucket holding the aarch64 shardgate artifact (README.md: how to build and upload it); the fleet also keeps its shard map and reports there."
  type        = string
}

variable "artifact_key" {
  description = "Key of the artifact in artifact_bucket: a .tar.gz with bin/shardgate and bin/loadgen."
  type        = string
  default     = "shardgate/shardgate-aarch64-linux.tar.gz"
}

variable "shardmap_file" {
  description = "The shard map, rendered with `shardgate shardmap split --shards N --primary <output primary_url_template>` (README.md)."
  type        = string
  default     = "shardmap.toml"
}

variable "schema_file" {
  description = "SQL applied to every shard database at creation (the sharded tables); null: deploy/local/schema.sql (the kv table loadgen uses)."
  type        = string
  default     = null
}

variable "database" {
  description = "The shard database on every primary, and the database clients name."
  type        = string
  default     = "shard"
}

variable "app_password" {
  description = "Password of the user clients log in to the routers as (app)."
  type        = string
  sensitive   = true
  validation {
    condition     = can(regex("^[A-Za-z0-9_.~-]{12,}$", var.app_password))
    error_message = "app_password: at least 12 characters of letters, digits and _ . ~ - (it goes into URLs, TOML and shell unescaped)."
  }
}

variable "admin_password" {
  description = "Password of the routers' admin console user (admin)."
  type        = string
  sensitive   = true
  validation {
    condition     = can(regex("^[A-Za-z0-9_.~-]{12,}$", var.admin_password))
    error_message = "admin_password: at least 12 characters of letters, digits and _ . ~ - (it goes into URLs, TOML and shell unescaped)."
  }
}

variable "backend_password" {
  description = "Password of the user the routers log in to the primaries as (shardgate)."
  type        = string
  sensitive   = true
  validation {
    condition     = can(regex("^[A-Za-z0-9_.~-]{12,}$", var.backend_password))
    error_message = "backend_password: at least 12 characters of letters, digits and _ . ~ - (it goes into URLs, TOML and shell unescaped)."
  }
}

variable "hourly_price" {
  description = "On-demand price per hour of each instance type in the region (USD), for the cost output. Check the current AWS price list: these are us-east-1 Linux list prices as we knew them."
  type        = map(number)
  default = {
    "r8g.16xlarge" = 3.7706
    "c8g.8xlarge"  = 1.2762
    "c8g.16xlarge" = 2.5523
    "r8g.8xlarge"  = 1.8853
  }
}
