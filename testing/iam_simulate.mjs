// One IAM decision per line, for testing/iam_policy.py: a JSON request on stdin
// {"policies": [...], "principal": ARN, "account": ID, "action": "svc:Action", "resource": ARN, "context": {...}}
// answered on stdout by {"result": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied"} or {"error": ...}.
// The evaluation is @cloud-copilot/iam-simulate's (actions, resources, every condition operator,
// explicit denies), which also refuses an action or resource ARN the Service Authorization
// Reference does not define for it (its iam-data), so a wrong request context is an error, not a pass.
import { createInterface } from 'node:readline'
import { runSimulation } from '@cloud-copilot/iam-simulate'

const lines = createInterface({ input: process.stdin })
for await (const line of lines) {
  let answer
  try {
    const ask = JSON.parse(line)
    const response = await runSimulation(
      {
        identityPolicies: ask.policies.map((policy, i) => ({ name: `policy-${i}`, policy })),
        serviceControlPolicies: [],
        resourceControlPolicies: [],
        request: {
          action: ask.action,
          principal: ask.principal,
          resource: { accountId: ask.account, resource: ask.resource },
          contextVariables: ask.context,
        },
      },
      {},
    )
    answer =
      response.resultType === 'error'
        ? { error: JSON.stringify(response.errors) }
        : { result: response.overallResult }
  } catch (err) {
    answer = { error: String(err) }
  }
  process.stdout.write(JSON.stringify(answer) + '\n')
}
