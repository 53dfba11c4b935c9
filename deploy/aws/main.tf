# What the fleet's parts share: the layout (names, zones, subnets, connection budget), the
# rendered configuration, the AMI, and the S3 objects every member reads.

module "layout" {
  source             = "./modules/layout"
  shard_count        = var.shard_count
  azs                = var.azs
  vpc_cidr           = var.vpc_cidr
  router_count       = var.router_count
  router_workers     = var.router_workers
  database           = var.database
  shared_connections = var.shared_connections
}

module "config" {
  source             = "./modules/config"
  primary_memory_gib = var.primary_memory_gib
  primary_vcpus      = var.primary_vcpus
  max_connections    = module.layout.max_connections
  database           = var.database
  pool_max_size      = var.pool_max_size
  shared_connections = var.shared_connections
  app_password       = var.app_password
  admin_password     = var.admin_password
  backend_password   = var.backend_password
}

# Debian 12 for arm64, the newest official image.
data "aws_ami" "debian" {
  most_recent = true
  owners      = ["136693071363"]
  filter {
    name   = "name"
    values = ["debian-12-arm64-*"]
  }
  filter {
    name   = "architecture"
    values = ["arm64"]
  }
}

data "aws_s3_bucket" "artifacts" {
  bucket = var.artifact_bucket
}

resource "aws_s3_object" "shardmap" {
  bucket = data.aws_s3_bucket.artifacts.id
  key    = "${var.name}/shardmap.toml"
  source = var.shardmap_file
  etag   = filemd5(var.shardmap_file)

  lifecycle {
    precondition {
      condition     = length(regexall("(?m)^\\[\\[shards\\]\\]", file(var.shardmap_file))) == var.shard_count
      error_message = "shardmap_file must have exactly shard_count shards: render it with `shardgate shardmap split --shards N --primary <primary_url_template output>`."
    }
  }
}

locals {
  shardmap_uri = "s3://${var.artifact_bucket}/${aws_s3_object.shardmap.key}"
  artifact_uri = "s3://${var.artifact_bucket}/${var.artifact_key}"
  reports_uri  = "s3://${var.artifact_bucket}/${var.name}/reports"
}
