# Instance roles: SSM Session Manager for every instance (no SSH needed); routers and load
# generators read the artifact and the shard map; load generators write their reports.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "fleet" {
  statement {
    actions = ["s3:GetObject"]
    resources = [
      "${data.aws_s3_bucket.artifacts.arn}/${var.artifact_key}",
      "${data.aws_s3_bucket.artifacts.arn}/${var.name}/shardmap.toml",
    ]
  }
  statement {
    actions   = ["s3:PutObject"]
    resources = ["${data.aws_s3_bucket.artifacts.arn}/${var.name}/reports/*"]
  }
}

resource "aws_iam_role" "fleet" {
  name               = "${var.name}-fleet"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

resource "aws_iam_role_policy" "fleet" {
  name   = "${var.name}-fleet"
  role   = aws_iam_role.fleet.id
  policy = data.aws_iam_policy_document.fleet.json
}

resource "aws_iam_role_policy_attachment" "ssm" {
  role       = aws_iam_role.fleet.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "fleet" {
  name = "${var.name}-fleet"
  role = aws_iam_role.fleet.name
}
