/**
 * @generated SignedSource<<ce60c736e3cea034172fae37bb2fd174>>
 * @lightSyntaxTransform
 * @nogrep
 */

/* eslint-disable */

'use strict';

var node = (function(){
var v0 = [
  {
    "defaultValue": null,
    "kind": "LocalArgument",
    "name": "skus"
  }
],
v1 = [
  {
    "alias": null,
    "args": [
      {
        "kind": "Variable",
        "name": "skus",
        "variableName": "skus"
      }
    ],
    "concreteType": "Stock",
    "kind": "LinkedField",
    "name": "stockChanged",
    "plural": false,
    "selections": [
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "id",
        "storageKey": null
      },
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "available",
        "storageKey": null
      },
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "held",
        "storageKey": null
      },
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "sold",
        "storageKey": null
      },
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "total",
        "storageKey": null
      },
      {
        "alias": null,
        "args": null,
        "kind": "ScalarField",
        "name": "updatedAt",
        "storageKey": null
      }
    ],
    "storageKey": null
  }
];
return {
  "fragment": {
    "argumentDefinitions": (v0/*: any*/),
    "kind": "Fragment",
    "metadata": null,
    "name": "stockLiveSubscription",
    "selections": (v1/*: any*/),
    "type": "Subscription",
    "abstractKey": null
  },
  "kind": "Request",
  "operation": {
    "argumentDefinitions": (v0/*: any*/),
    "kind": "Operation",
    "name": "stockLiveSubscription",
    "selections": (v1/*: any*/)
  },
  "params": {
    "cacheID": "fb3e2e25b25d0f850df336d3c13e3867",
    "id": null,
    "metadata": {},
    "name": "stockLiveSubscription",
    "operationKind": "subscription",
    "text": "subscription stockLiveSubscription(\n  $skus: [ID!]!\n) {\n  stockChanged(skus: $skus) {\n    id\n    available\n    held\n    sold\n    total\n    updatedAt\n  }\n}\n"
  }
};
})();

node.hash = "4fea5abeaa2ea78b3fc5a82932b67dc3";

export default node;
