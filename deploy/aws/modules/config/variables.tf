variable "primary_memory_gib" {
  description = "Memory of a shard primary's instance type in GiB (r8g.16xlarge: 512)."
  type        = number
  default     = 512
  validation {
    condition     = var.primary_memory_gib >= 1
    error_message = "primary_memory_gib must be at least 1."
  }
}

variable "primary_vcpus" {
  description = "vCPUs of a shard primary's instance type (r8g.16xlarge: 64)."
  type        = number
  default     = 64
  validation {
    condition     = var.primary_vcpus >= 1 && floor(var.primary_vcpus) == var.primary_vcpus
    error_message = "primary_vcpus must be a whole number of at least 1."
  }
}

variable "max_connections" {
  description = "max_connections of every primary (the layout module's connection budget)."
  type        = number
  validation {
    condition     = var.max_connections >= 20 && var.max_connections <= 262143
    error_message = "max_connections must be from 20 to 262143 (Postgres's limit)."
  }
}

variable "huge_pages" {
  description = "huge_pages: try (use them when reserved, else start without) or on (refuse to start without)."
  type        = string
  default     = "try"
  validation {
    condition     = contains(["try", "on", "off"], var.huge_pages)
    error_message = "huge_pages must be try, on or off."
  }
}

variable "postgres_port" {
  description = "Postgres port of the primaries."
  type        = number
  default     = 5432
}

variable "max_slot_wal_keep_size_gb" {
  description = "WAL a replication slot may hold back (a split's slot that is abandoned is invalidated past it instead of filling the disk)."
  type        = number
  default     = 200
}

variable "max_wal_size_gb" {
  description = "max_wal_size, in GB."
  type        = number
  default     = 64
}

variable "router_port" {
  description = "Port the routers listen on for clients (the NLB's listener forwards to it)."
  type        = number
  default     = 6432
}

variable "http_port" {
  description = "The routers' HTTP side port: /metrics, /health, /ready (the NLB health check)."
  type        = number
  default     = 9930
}

variable "database" {
  description = "Database name clients connect to through the routers."
  type        = string
  default     = "shard"
}

variable "app_user" {
  description = "The user clients log in to the routers as."
  type        = string
  default     = "app"
}

variable "app_password" {
  description = "Its password."
  type        = string
  sensitive   = true
}

variable "admin_user" {
  description = "The routers' admin console user (database shardgate)."
  type        = string
  default     = "admin"
}

variable "admin_password" {
  description = "Its password."
  type        = string
  sensitive   = true
}

variable "backend_user" {
  description = "The user routers log in to the primaries as."
  type        = string
  default     = "shardgate"
}

variable "backend_password" {
  description = "Its password."
  type        = string
  sensitive   = true
}

variable "pool_max_size" {
  description = "[pool] max_size: backend connections per router worker and shard at most."
  type        = number
  default     = 4
  validation {
    condition     = var.pool_max_size >= 1
    error_message = "pool_max_size must be at least 1."
  }
}

variable "shared_connections" {
  description = "[pool] shared_connections: backend connections per router and shard on which all clients' autocommit statements are pipelined (0: off)."
  type        = number
  default     = 1
  validation {
    condition     = var.shared_connections >= 0
    error_message = "shared_connections must be 0 or more."
  }
}

variable "pause_timeout_ms" {
  description = "[pool] pause_timeout_ms: how long statements for a paused shard (a split's cut-over) wait."
  type        = number
  default     = 60000
}

variable "max_clients" {
  description = "[limits] max_clients per router."
  type        = number
  default     = 20000
}

variable "drain_grace_ms" {
  description = "[shutdown] drain_grace_ms: at least the NLB health check interval times its unhealthy threshold."
  type        = number
  default     = 25000
}

variable "drain_timeout_ms" {
  description = "[shutdown] drain_timeout_ms; also the NLB target group's deregistration delay."
  type        = number
  default     = 30000
}
