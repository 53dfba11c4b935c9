# The fleet on AWS Graviton: shard primaries, routers behind a Network Load Balancer, load
# generators. See README.md for the walk-through; modules/layout and modules/config hold the
# arithmetic and the rendered files (both provider-free, tested offline).

terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.40"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = {
      Project = "shardgate"
      Fleet   = var.name
    }
  }
}
